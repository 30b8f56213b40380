"""How a training round's replies become one outer step: taken in and decoded one at a time
(:mod:`dept_strategy.replies`), spooled and folded into a running mean
(:mod:`dept_strategy.spool`, :mod:`dept_strategy.aggregate`), screened for size
(:mod:`dept_strategy.screening`, fragments sized in rounds of training) and for direction
(:mod:`dept_strategy.direction`), diagnosed
(:mod:`dept_strategy.diagnostics`), combined by the run's rule and stepped. The strategy
(:class:`dept_strategy.strategy.DeptStrategy`) inherits this; it holds the state used here.
"""

from __future__ import annotations

import functools
import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from flwr.app import Message

from dept_strategy.aggregate import RunningMean, combine
from dept_strategy.diagnostics import Gram, gram, round_diagnostics, theta_and_phi, update_norms
from dept_strategy.direction import screen_directions, smoothed
from dept_strategy.fragments import FragmentBook
from dept_strategy.history import RunHistory
from dept_strategy.inflight import InFlight
from dept_strategy.outer import OuterOptimizer
from dept_strategy.replies import Arrival, Intake, ReplyDesk
from dept_strategy.screening import UpdateStats, screen
from dept_strategy.settings import StrategySettings
from dept_strategy.spool import RoundSpool, Spooled
from dept_strategy.validation import ReplyRows

log = logging.getLogger(__name__)


class RoundCombining:
    """The training round's combining step, over the strategy's state (declared here)."""

    settings: StrategySettings
    outer: OuterOptimizer
    history: RunHistory
    in_flight: InFlight
    fragments: FragmentBook | None
    embedding_names: tuple[str, ...]
    spool_dir: Path | None
    reference: UpdateStats | None
    _round_shapes: Callable[[int], dict[str, tuple[int, ...]]]
    _expected: Callable[..., tuple[dict[str, tuple[int, ...]], ReplyRows | None]]
    _close: Callable[[ReplyDesk], None]

    def _step(
        self, server_round: int, replies: Iterable[Message], desk: ReplyDesk
    ) -> list[Arrival] | None:
        """Take the round's replies in, screen them, combine them and step the outer
        optimizer; the replies that counted, or None (the model unchanged). Whatever the
        round held (spool, running mean) is let go on return, before the body is serialised."""
        rule, shapes = self.settings.defences.aggregation, self._round_shapes(server_round)
        max_weight = (  # the reach's weight decay term bounds weights no larger than this
            max(_largest(t) for t in self.outer.tensors().values())
            if self.settings.defences.reach
            else 0.0
        )
        sampled = len(self.in_flight.sources())  # fixed before any reply: central DP's n
        with RoundSpool(self._spool(server_round)) as spool:
            fold_as_they_come = rule == "mean" and self.settings.server_memory == "fast"
            running = (
                RunningMean(shapes, self.embedding_names, self.in_flight.sources())
                if fold_as_they_come
                else None
            )
            intake = Intake(
                functools.partial(self._expected, shapes),
                self.settings.max_tokens_per_round,
                self.settings.compression,
                self.embedding_names,
                spool,
                running,
                self.settings.topk_density,
                self._units(server_round, max_weight),
                self.settings.embedding_row_weight,
            )
            arrivals = desk.take_train(replies, intake)
            self._close(desk)
            accepted = self._screen(server_round, arrivals, desk, max_weight)
            theta = self._theta_gram(accepted, shapes) if accepted else None
            accepted, cosines = self._screen_directions(server_round, accepted, theta, desk)
            if len(accepted) < self.settings.min_train_replies:
                log.warning(
                    "round %d: %d usable training replies, fewer than %d (config key "
                    "'min-train-replies'); the model is unchanged",
                    server_round,
                    len(accepted),
                    self.settings.min_train_replies,
                )
                return None
            self._diagnose(server_round, accepted, shapes, theta, cosines)
            # In source order, not arrival order: the float32 mean rounds by order, and a
            # deployment's arrival order is not the same twice (a resumed run must match);
            # the running mean was folded in that order as far as arrivals allowed.
            combined = [a.spooled for a in _by_source(accepted)]
            privacy = self.settings.privacy
            if privacy.on:  # the settings allow DP with the mean only
                combined = self._clipped_for_privacy(server_round, combined, sampled)
                if running is not None:  # its weights change: one each
                    running.refold(combined)
            delta, frozen_rows = combine(
                combined,
                shapes,
                self.embedding_names,
                running,
                rule=rule,
                trim_fraction=self.settings.defences.trim_fraction,
            )
        if privacy.on:
            privacy.add_noise(delta, sampled)
        self.outer.step(delta, frozen_rows)
        return accepted

    def _clipped_for_privacy(
        self, server_round: int, replies: list[Spooled], sampled: int
    ) -> list[Spooled]:
        """``replies`` as central DP combines them (:mod:`dept_strategy.privacy`): one
        weight each, each clipped to ``dp-clip-norm``, their mean rescaled to a sum over the
        ``sampled`` sources; the round's ε recorded."""
        privacy = self.settings.privacy
        factors = []
        for reply in replies:
            norms = update_norms(reply, self.embedding_names)
            factors.append(privacy.clip_factor(math.sqrt(sum(v * v for v in norms.values()))))
        released = sum(1 for r in self.history.rounds.values() if r.privacy) + 1
        self.history.at(server_round).privacy = {
            "epsilon": privacy.epsilon(released),
            "delta": privacy.delta,
            "noise_multiplier": privacy.noise_multiplier,
            "clip_norm": privacy.clip_norm,
            "released_rounds": released,
            "sampled": sampled,
            "clipped": sum(1 for f in factors if f < 1),
        }
        share = len(replies) / sampled  # the mean of len(replies) made a sum over ``sampled``
        return [
            replace(r, weight=1.0, scale=r.scale * f * share)
            for r, f in zip(replies, factors, strict=True)
        ]

    def _theta_gram(
        self, accepted: list[Arrival], shapes: dict[str, tuple[int, ...]]
    ) -> Gram | None:
        """θ's Gram sums over the accepted updates in source order, read once from the
        spool for the direction check and the interference; None where neither is on."""
        if not (self.settings.interference or self.settings.defences.direction_factor > 0):
            return None
        ordered = _by_source(accepted)
        names = theta_and_phi(shapes, self.embedding_names)["theta"]
        return gram([a.spooled for a in ordered], names, shapes)

    def _screen_directions(
        self, server_round: int, accepted: list[Arrival], theta: Gram | None, desk: ReplyDesk
    ) -> tuple[list[Arrival], dict[str, float]]:
        """The accepted updates, those pointing unlike the round's others
        (:func:`dept_strategy.direction.screen_directions`) clipped or dropped; and each
        source's agreement with the others (its per-tensor cosine with their mean)."""
        factor = self.settings.defences.direction_factor
        if theta is None or factor <= 0:
            return accepted, {}
        ordered = _by_source(accepted)
        scales = np.array([a.spooled.scale for a in ordered])
        weights = np.array([a.spooled.weight for a in ordered]) * scales
        by_tensor = (dots * np.outer(scales, scales) for dots in theta.by_tensor.values())
        before = np.array(
            [self._smoothed_agreement(a.target.source, server_round) for a in ordered]
        )
        cosines, flagged = screen_directions(by_tensor, weights, factor=factor, before=before)
        by_source = {a.target.source: float(c) for a, c in zip(ordered, cosines, strict=True)}
        kept = desk.screened(ordered, flagged, self.settings.defences.outlier_action)
        if len(kept) < len(ordered):  # a dropped reply: the Gram's rows are the kept ones
            held = np.ix_(*[[i for i, a in enumerate(ordered) if any(k is a for k in kept)]] * 2)
            theta.dot, theta.sq = theta.dot[held], theta.sq[held]
            theta.by_tensor = {n: dots[held] for n, dots in theta.by_tensor.items()}
        return kept, by_source

    def _smoothed_agreement(self, source: str, server_round: int) -> float:
        """``source``'s agreement smoothed over its rounds before ``server_round`` (from
        the run's history, so a resumed run goes on with it); NaN where it has none."""
        value = math.nan
        for number, record in sorted(self.history.rounds.items()):
            found = record.agreement.get(source)
            if number < server_round and found is not None and math.isfinite(found):
                value = float(smoothed(found, value))
        return value

    def _diagnose(
        self,
        server_round: int,
        accepted: list[Arrival],
        shapes: dict[str, tuple[int, ...]],
        theta: Gram | None,
        cosines: dict[str, float],
    ) -> None:
        """The accepted updates' norms and, if on, their interference (θ's from ``theta``,
        the rest read from the spool, :mod:`dept_strategy.diagnostics`) and each source's
        cosine with the others' mean (``cosines``, the direction check's) into the round's
        record."""
        start = time.perf_counter()
        ordered = _by_source(accepted)  # rows alike every round
        found = round_diagnostics(
            [a.target.source for a in ordered],
            [a.spooled for a in ordered],
            shapes,
            self.embedding_names,
            interference=self.settings.interference,
            theta=theta,
        )
        if cosines:  # the next rounds' direction check reads them back
            found["agreement"] = cosines
        self.history.record_diagnostics(server_round, found, time.perf_counter() - start)

    def _spool(self, server_round: int) -> Path:
        if self.spool_dir is None:
            self.spool_dir = Path(tempfile.mkdtemp(prefix="dept-spool-"))
        return self.spool_dir / f"round-{server_round:04d}"

    def _units(self, server_round: int, max_weight: float) -> dict[str, float]:
        """What a synced fragment tensor's Δ may hold, in rounds of training: its span's
        reach over one round's (:class:`dept_strategy.screening.SizeTally`), for those that
        span more than this round; none without fragments or a finite reach."""
        reach = self.settings.defences.reach
        if self.fragments is None or reach is None:
            return {}
        one = reach(range(server_round, server_round + 1), max_weight)
        if not 0 < one < math.inf:
            return {}
        spans = self.fragments.spans(server_round)
        return {n: reach(s, max_weight) / one for n, s in spans.items() if len(s) > 1}

    def _screen(
        self, server_round: int, arrivals: list[Arrival], desk: ReplyDesk, max_weight: float
    ) -> list[Arrival]:
        """The arrivals to combine: those of an honest size as they are, and those too large
        (:func:`dept_strategy.screening.screen`) clipped to the round's median or dropped."""
        reach, rules = 0.0, self.settings.defences
        if rules.reach is not None:
            reach = rules.reach(range(server_round, server_round + 1), max_weight)
        flagged = screen(
            [a.spooled.stats for a in arrivals],
            reach=reach,
            factor=rules.update_norm_factor,
            flatness=rules.flatness_factor,
            previous=self.reference,
        )
        return desk.screened(arrivals, flagged, rules.outlier_action)


def _by_source(arrivals: list[Arrival]) -> list[Arrival]:
    return sorted(arrivals, key=lambda a: a.target.source)


def _largest(tensor: torch.Tensor) -> float:
    """max |value|, without the tensor-sized temporary of ``tensor.abs()``."""
    if tensor.numel() == 0:
        return 0.0
    low, high = torch.aminmax(tensor)
    return max(-float(low), float(high))
