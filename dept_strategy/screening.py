"""Which of a round's well-formed pseudo-gradients are too large to be honest.

A reply that passes validation (keys, shapes, finite values) can still wreck the body: one
node sending its update × 1e6 moved a shared weight to 2.6e8. Two checks refuse such a reply
and name its source; neither changes an honest round:

- **reach**: no weight can move further in a round than the inner AdamW's learning rates
  allow (:func:`dept.train.local.max_round_update`, computed by the caller and passed in as
  ``reach``), so a larger max |Δ| is impossible for an honest client, whatever the others
  sent; this holds even for a round with a single reply. A fragment's Δ (partial sync)
  holds every round since its base, so its values are sized in rounds of training: divided
  by its span's reach over one round's (``units``), they meet the one-round bound exactly
  when they meet their span's;
- **relative** (``update-norm-factor`` k): the RMS and the max |Δ| of the body part, and of
  the embedding part where there is one, must be within k × the round's median of the same
  figure. The median is the lower one over the round's replies plus the previous round's
  accepted median, so one outlier among two replies, or the only reply, is still caught;
  before there is a previous round, it needs three replies (of two, either could be the
  outlier: a tiny one would make the honest one look large).

RMS rather than the norm, so that parts of different sizes (TRIM sends each source a
different number of φ rows) compare alike. The relative check sees the same units: a
fragment that spans three rounds is not three times too large beside one that spans one,
nor beside last round's median, and normalising by the reach (not comparing per span) keeps
one median for the round, which a round of few replies needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from dept.config import AGGREGATIONS as RULES
from dept.config import OUTLIER_ACTIONS

CHUNK_VALUES = 1 << 20  # values converted to float64 at once
REACH_SLACK = 1.05  # compression error feedback and float rounding on top of the bound


@dataclass(frozen=True)
class Defences:
    """How a round's replies are screened and combined (run config keys in brackets)."""

    aggregation: str = "mean"  # one of RULES (aggregation)
    outlier_action: str = "clip"  # clip: scaled to the round's median size; reject: dropped
    trim_fraction: float = 0.2  # trimmed-mean: share dropped at each end (trim-fraction)
    update_norm_factor: float = 10.0  # k of the relative check, 0 off (update-norm-factor)
    flatness_factor: float = 0.0  # k of the flatness check, 0 off (flatness-factor)
    # robust deviations of the leave-one-out cosine, 0 off (direction-factor)
    direction_factor: float = 4.0
    # the most the training of these rounds can move a weight no larger than this;
    # None: not checked (dept.train.local.max_span_update, bound to the run config)
    reach: Callable[[range, float], float] | None = None

    @classmethod
    def from_config(cls, cfg: Any, **runtime: Any) -> Defences:
        """The defences of a run config: every field named as a config key is that key's
        value; ``runtime`` gives the rest (the reach, bound to the run's schedule)."""
        named = {
            f.name: getattr(cfg, f.name)
            for f in fields(cls)
            if f.name not in runtime and hasattr(cfg, f.name)
        }
        return cls(**named, **runtime)

    def __post_init__(self) -> None:
        if self.aggregation not in RULES:
            raise ValueError(f"aggregation must be one of {RULES}, got {self.aggregation!r}")
        if self.outlier_action not in OUTLIER_ACTIONS:
            raise ValueError(f"outlier_action must be one of {OUTLIER_ACTIONS}")

    @property
    def against_others(self) -> tuple[str, ...]:
        """The run config keys of the checks on, which judge an update against the round's
        other updates (their median, their direction) rather than on its own."""
        factors = {
            "update-norm-factor": self.update_norm_factor,
            "flatness-factor": self.flatness_factor,
            "direction-factor": self.direction_factor,
        }
        return tuple(key for key, factor in factors.items() if factor > 0)

    def each_on_its_own(self) -> Defences:
        """These defences with only the checks that judge each update by itself (its reach):
        what central DP allows. A check against the others lets one source decide whether
        another's update counts, so removing it could move the released sum by more than
        one clipped update, beyond what the noise is sized for."""
        return replace(self, update_norm_factor=0.0, flatness_factor=0.0, direction_factor=0.0)


@dataclass(frozen=True)
class UpdateStats:
    """Sizes of one pseudo-gradient: RMS and max |Δ| of its body and embedding parts."""

    body_rms: float
    body_max: float
    embedding_rms: float = 0.0  # 0: the update has no embedding part (SPEC, SPEC-OPT)
    embedding_max: float = 0.0

    @property
    def max_abs(self) -> float:
        return max(self.body_max, self.embedding_max)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def scaled(self, factor: float) -> UpdateStats:
        return UpdateStats(**{k: v * factor for k, v in asdict(self).items()})


class UpdateSizes:
    """The sums behind :class:`UpdateStats`, fed one tensor at a time as a reply is read, so
    no whole reply is needed at once; in float64, so 3e38 does not overflow them. ``units``:
    a tensor's values are divided by this (a fragment's rounds of training, as reach), one
    where absent."""

    def __init__(
        self, embedding_names: tuple[str, ...], units: Mapping[str, float] | None = None
    ) -> None:
        self.embedding_names, self.units = embedding_names, units or {}
        # part -> [sum of squares, count, max |value|]
        self.parts = {"body": [0.0, 0, 0.0], "embedding": [0.0, 0, 0.0]}

    def add(self, name: str, value: np.ndarray) -> None:
        part = self.parts["embedding" if name in self.embedding_names else "body"]
        flat, unit = value.reshape(-1), self.units.get(name)
        for start in range(0, flat.size, CHUNK_VALUES):  # float64 copies of a chunk only
            chunk = flat[start : start + CHUNK_VALUES].astype(np.float64)
            if unit is not None:
                chunk /= unit
            part[0] += float(np.dot(chunk, chunk))
            part[2] = max(part[2], float(np.abs(chunk).max(initial=0.0)))
        part[1] += flat.size

    def observe(
        self, tensors: Iterable[tuple[str, np.ndarray]]
    ) -> Iterator[tuple[str, np.ndarray]]:
        """``tensors`` passed on unchanged, each added on the way."""
        for name, value in tensors:
            self.add(name, value)
            yield name, value

    def stats(self) -> UpdateStats:
        rms = {k: math.sqrt(v[0] / v[1]) if v[1] else 0.0 for k, v in self.parts.items()}
        body, embedding = self.parts["body"], self.parts["embedding"]
        return UpdateStats(rms["body"], body[2], rms["embedding"], embedding[2])


def lower_median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


@dataclass(frozen=True)
class Flagged:
    """An update too large to be honest: why, and the factor that brings it down to the
    round's median sizes (and within reach), for ``outlier-action`` clip."""

    why: str
    shrink: float


def screen(
    stats: list[UpdateStats],
    *,
    reach: float,
    factor: float,
    previous: UpdateStats | None,
    flatness: float = 0.0,
) -> dict[int, Flagged]:
    """``{index: Flagged}`` for the updates too large to be honest (the rest are fine).

    ``reach``: the most an honest update can move a weight this round (0: not checked);
    ``factor``: k of the relative check (0: off); ``previous``: last round's accepted median;
    ``flatness``: k of the flatness check (0: off, :func:`_too_flat`).
    """
    if not stats:
        return {}
    if previous is None and len(stats) < 3:  # a median of two is either reply: no reference
        factor = flatness = 0
    extra = [previous] if previous is not None else []
    medians = _medians([*stats, *extra]).as_dict()
    flat = lower_median([_flatness(s) for s in [*stats, *extra]])
    flagged = {}
    for i, s in enumerate(stats):
        why = _too_large(s, medians, reach, factor)
        if why:  # without the relative check the medians are no reference: one is its own
            flagged[i] = Flagged(why, _shrink(s, medians if factor > 0 else {}, reach))
        elif flatness > 0 and (why := _too_flat(s, flat, medians["body_rms"], flatness)):
            flagged[i] = Flagged(why, medians["body_rms"] / s.body_rms)
    return flagged


def _flatness(s: UpdateStats) -> float:
    """RMS over max |Δ| of the body: 1 when every value has one magnitude."""
    return s.body_rms / s.body_max if s.body_max > 0 else 0.0


def _too_flat(s: UpdateStats, median: float, median_rms: float, factor: float) -> str:
    """Why ``s`` is a flattened update larger than the round's: AdamW's steps are
    heavy-tailed (flatness 0.16-0.27 after 25 steps in the poisoning runs), an update of
    signs only (every value ±its largest) is 1, at 4x the median RMS and within every size
    bound. A flat update no larger than the median (one Adam step) is let be."""
    value = _flatness(s)
    if median <= 0 or value <= factor * median or s.body_rms <= median_rms:
        return ""
    return (
        f"flatness (RMS / max |update|) {value:.3g} is {value / median:.3g}x the round's "
        f"median {median:.3g} at {s.body_rms / median_rms:.3g}x its RMS: a flattened "
        f"(signs-only) update (config key 'flatness-factor' is {factor:g})"
    )


def _too_large(s: UpdateStats, medians: dict[str, float], reach: float, factor: float) -> str:
    if reach > 0 and s.max_abs > REACH_SLACK * reach:
        return (
            f"max |update| {s.max_abs:.3g} is beyond what this round's local training can "
            f"move a weight ({reach:.3g})"
        )
    for name, median in medians.items() if factor > 0 else ():
        value = getattr(s, name)
        if median > 0 and value > factor * median:
            return (
                f"{name.replace('_', ' ')} {value:.3g} is {value / median:.3g}x the round's "
                f"median {median:.3g} (config key 'update-norm-factor' is {factor:g})"
            )
    return ""


def _shrink(s: UpdateStats, medians: dict[str, float], reach: float) -> float:
    """The largest factor ≤ 1 that takes no figure of ``s`` above its median nor its max
    beyond ``reach``."""
    limits = [m / getattr(s, n) for n, m in medians.items() if m > 0 and getattr(s, n) > 0]
    if reach > 0 and s.max_abs > 0:
        limits.append(reach / s.max_abs)
    return min([1.0, *limits])


def median_stats(stats: list[UpdateStats]) -> UpdateStats | None:
    """The per-figure lower median of the accepted updates: the next round's reference."""
    return _medians(stats) if stats else None


def _medians(stats: list[UpdateStats]) -> UpdateStats:
    return UpdateStats(
        **{f.name: lower_median([getattr(s, f.name) for s in stats]) for f in fields(UpdateStats)}
    )
