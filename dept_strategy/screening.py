"""Which of a round's well-formed pseudo-gradients are too large to be honest.

A reply that passes validation (keys, shapes, finite values) can still wreck the body: one
node sending its update × 1e6 moved a shared weight to 2.6e8. Two checks refuse such a reply
and name its source; neither changes an honest round:

- **reach**: no weight can move further in a round than the inner AdamW's learning rates
  allow (:func:`dept.train.max_round_update`, computed by the caller and passed in as
  ``reach``), so a larger max |Δ| is impossible for an honest client, whatever the others
  sent; this holds even for a round with a single reply;
- **relative** (``update-norm-factor`` k): the RMS and the max |Δ| of the body part, and of
  the embedding part where there is one, must be within k × the round's median of the same
  figure. The median is the lower one over the round's replies plus the previous round's
  accepted median, so one outlier among two replies, or the only reply, is still caught.

RMS rather than the norm, so that parts of different sizes (TRIM sends each source a
different number of φ rows) compare alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import numpy as np

from dept.config import AGGREGATIONS as RULES

REACH_SLACK = 1.05  # compression error feedback and float rounding on top of the bound


@dataclass(frozen=True)
class Defences:
    """How a round's replies are screened and combined (run config keys in brackets)."""

    aggregation: str = "mean"  # one of RULES (aggregation)
    trim_fraction: float = 0.2  # trimmed-mean: share dropped at each end (trim-fraction)
    update_norm_factor: float = 10.0  # k of the relative check, 0 off (update-norm-factor)
    # the most a round starting at this global step can move a weight no larger than this;
    # None: not checked (dept.train.max_round_update, bound to the run config)
    reach: Callable[[int, float], float] | None = None

    def __post_init__(self) -> None:
        if self.aggregation not in RULES:
            raise ValueError(f"aggregation must be one of {RULES}, got {self.aggregation!r}")


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


def update_stats(delta: dict[str, np.ndarray], embedding_names: tuple[str, ...]) -> UpdateStats:
    """The sizes of ``delta``; sums of squares in float64, so 3e38 does not overflow them."""
    parts = {"body": [0.0, 0, 0.0], "embedding": [0.0, 0, 0.0]}  # sum of squares, count, max
    for name, value in delta.items():
        part = parts["embedding" if name in embedding_names else "body"]
        flat = value.reshape(-1).astype(np.float64)
        part[0] += float(np.dot(flat, flat))
        part[1] += flat.size
        part[2] = max(part[2], float(np.abs(flat).max(initial=0.0)))
    rms = {k: math.sqrt(v[0] / v[1]) if v[1] else 0.0 for k, v in parts.items()}
    return UpdateStats(rms["body"], parts["body"][2], rms["embedding"], parts["embedding"][2])


def lower_median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def screen(
    stats: list[UpdateStats], *, reach: float, factor: float, previous: UpdateStats | None
) -> dict[int, str]:
    """``{index: why}`` for the updates to refuse (the rest are kept).

    ``reach``: the most an honest update can move a weight this round (0: not checked);
    ``factor``: k of the relative check (0: off); ``previous``: last round's accepted median.
    """
    refused: dict[int, str] = {}
    if reach > 0:
        for i, s in enumerate(stats):
            if s.max_abs > REACH_SLACK * reach:
                refused[i] = (
                    f"max |update| {s.max_abs:.3g} is beyond what this round's local training "
                    f"can move a weight ({reach:.3g})"
                )
    if factor <= 0 or not stats:
        return refused
    for field in fields(UpdateStats):
        values = [getattr(s, field.name) for s in stats]
        pool = values + ([getattr(previous, field.name)] if previous is not None else [])
        reference = lower_median(pool)
        if reference <= 0:
            continue
        for i, value in enumerate(values):
            if value > factor * reference and i not in refused:
                refused[i] = (
                    f"{field.name.replace('_', ' ')} {value:.3g} is {value / reference:.3g}x the "
                    f"round's median {reference:.3g} (config key 'update-norm-factor' is "
                    f"{factor:g})"
                )
    return refused


def median_stats(stats: list[UpdateStats]) -> UpdateStats | None:
    """The per-figure lower median of the accepted updates: the next round's reference."""
    if not stats:
        return None
    return UpdateStats(
        **{f.name: lower_median([getattr(s, f.name) for s in stats]) for f in fields(UpdateStats)}
    )
