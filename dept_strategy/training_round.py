"""A training round on the server, from its replies to the outer step: read this first.

:func:`train_round` is the round as one pipeline, each stage a plain function over explicit
values:

1. **take the replies in** (:meth:`dept_strategy.replies.Replies.take_train`): each one
   credited to the source it was sent to, checked (keys, shapes, φ rows, finite values,
   tokens within the round's), decoded and spooled to disk, and folded into the running
   mean as it arrives (:mod:`dept_strategy.validation`, :mod:`dept_strategy.spool`,
   :mod:`dept_strategy.aggregate`);
2. **screen their sizes** (:func:`screen_sizes`): an update beyond what local training can
   move a weight, or far larger or flatter than the round's, is clipped or dropped
   (:mod:`dept_strategy.screening`);
3. **screen their directions** (:func:`screen_directions`): one pointing against the
   round's others is clipped or dropped (:mod:`dept_strategy.direction`);
4. **record** their norms and how they interfere (:mod:`dept_strategy.diagnostics`);
5. **clip for privacy** (:func:`clip_for_privacy`, central DP only): one weight each, each
   clipped to ``dp-clip-norm``; under DP the checks of stages 2 and 3 that judge an update
   by the others' are off (:mod:`dept_strategy.privacy` says why);
6. **combine** them (:func:`dept_strategy.aggregate.combine`): the weighted mean (each φ row
   over the sources that sent it) or a robust rule, plus DP's noise;
7. **step** the outer optimizer (:mod:`dept_strategy.outer`).

The strategy (:mod:`dept_strategy.strategy`) makes the :class:`Round` and hands over the
replies; what the round took it credits, and it lets go of the nodes that failed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from flwr.app import Message

from dept_strategy.aggregate import RunningMean, combine
from dept_strategy.diagnostics import Gram, gram, round_diagnostics, theta_and_phi, update_norms
from dept_strategy.direction import screen_directions as flag_directions
from dept_strategy.direction import smoothed
from dept_strategy.history import RunHistory
from dept_strategy.outer import OuterOptimizer
from dept_strategy.replies import ExpectedShapes, Replies, ReplyRules, Update
from dept_strategy.screening import UpdateStats, screen
from dept_strategy.settings import StrategySettings
from dept_strategy.spool import RoundSpool, Spooled

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Round:
    """What one training round is combined from, besides its replies."""

    number: int
    settings: StrategySettings
    outer: OuterOptimizer  # the shared tensors and the step that moves them
    history: RunHistory  # where every reply that does not count is recorded
    shapes: dict[str, tuple[int, ...]]  # what the round's replies carry (fragments: some)
    expected: ExpectedShapes  # per source: those shapes, and which φ rows it may send
    sampled: int  # sources sent a message, fixed before any reply: central DP's n
    spool: Path  # where the round's replies wait on disk
    units: dict[str, float]  # a synced fragment's Δ in rounds of training (fragments > 1)
    reference: UpdateStats | None  # the last accepted round's median sizes
    max_weight: float  # the largest |weight| held: it bounds reach's weight decay term


def train_round(
    round_: Round, replies: Replies, messages: Iterable[Message]
) -> list[Update] | None:
    """Combine a training round's replies and step the outer optimizer; the updates that
    counted, or None (the model unchanged). Whatever the round held (spool, running mean)
    is let go on return, before the body is serialised."""
    settings = round_.settings
    with RoundSpool(round_.spool) as spool:
        running = _running_mean(round_, replies)
        rules = ReplyRules(
            round_.expected,
            settings.max_tokens_per_round,
            settings.compression,
            settings.embedding_names,
            spool,
            running,
            settings.topk_density,
            round_.units,
            settings.embedding_row_weight,
        )
        updates = replies.take_train(messages, rules)  # 1. in, checked, spooled
        updates = screen_sizes(round_, updates, replies)  # 2.
        theta = theta_gram(round_, updates)
        updates, agreement = screen_directions(round_, updates, theta, replies)  # 3.
        if len(updates) < settings.min_train_replies:
            log.warning(
                "round %d: %d usable training replies, fewer than %d (config key "
                "'min-train-replies'); the model is unchanged",
                round_.number,
                len(updates),
                settings.min_train_replies,
            )
            return None
        record_diagnostics(round_, updates, theta, agreement)  # 4.
        # In source order, not arrival order: the float32 mean rounds by order, and a
        # deployment's arrival order is not the same twice (a resumed run must match); the
        # running mean was folded in that order as far as arrivals allowed.
        combined = [u.spooled for u in by_source(updates)]
        privacy = settings.privacy
        if privacy.on:  # 5. (the settings allow DP with the mean only)
            combined = clip_for_privacy(round_, combined)
            if running is not None:  # its weights change: one each
                running.refold(combined)
        delta, frozen_rows = combine(  # 6.
            combined,
            round_.shapes,
            settings.embedding_names,
            running,
            rule=settings.defences.aggregation,
            trim_fraction=settings.defences.trim_fraction,
        )
    if privacy.on:
        privacy.add_noise(delta, round_.sampled)
    round_.outer.step(delta, frozen_rows)  # 7.
    return updates


def _running_mean(round_: Round, replies: Replies) -> RunningMean | None:
    """The mean replies are folded into as they arrive (the mean rule with the server's
    ``fast`` memory); None: the combine step folds it from the spool."""
    settings = round_.settings
    if settings.defences.aggregation != "mean" or settings.server_memory != "fast":
        return None
    return RunningMean(round_.shapes, settings.embedding_names, replies.in_flight.sources())


def screen_sizes(round_: Round, updates: list[Update], replies: Replies) -> list[Update]:
    """The updates to combine: those of an honest size as they are, and those too large
    (:func:`dept_strategy.screening.screen`) clipped to the round's median or dropped."""
    rules = round_.settings.defences
    reach = 0.0
    if rules.reach is not None:
        reach = rules.reach(range(round_.number, round_.number + 1), round_.max_weight)
    flagged = screen(
        [u.spooled.stats for u in updates],
        reach=reach,
        factor=rules.update_norm_factor,
        flatness=rules.flatness_factor,
        previous=round_.reference,
    )
    return replies.screened(updates, flagged, rules.outlier_action)


def theta_gram(round_: Round, updates: list[Update]) -> Gram | None:
    """θ's Gram sums over the updates in source order, read once from the spool for the
    direction check and the interference; None where neither is on or nothing came."""
    settings = round_.settings
    if not updates or not (settings.interference or settings.defences.direction_factor > 0):
        return None
    names = theta_and_phi(round_.shapes, settings.embedding_names)["theta"]
    return gram([u.spooled for u in by_source(updates)], names, round_.shapes)


def screen_directions(
    round_: Round, updates: list[Update], theta: Gram | None, replies: Replies
) -> tuple[list[Update], dict[str, float]]:
    """The updates, those pointing unlike the round's others
    (:func:`dept_strategy.direction.screen_directions`) clipped or dropped; and each
    source's agreement with the others (its per-tensor cosine with their mean)."""
    factor = round_.settings.defences.direction_factor
    if theta is None or factor <= 0:
        return updates, {}
    ordered = by_source(updates)
    scales = np.array([u.spooled.scale for u in ordered])
    weights = np.array([u.spooled.weight for u in ordered]) * scales
    by_tensor = (dots * np.outer(scales, scales) for dots in theta.by_tensor.values())
    before = np.array(
        [smoothed_agreement(round_.history, u.target.source, round_.number) for u in ordered]
    )
    cosines, flagged = flag_directions(by_tensor, weights, factor=factor, before=before)
    agreement = {u.target.source: float(c) for u, c in zip(ordered, cosines, strict=True)}
    kept = replies.screened(ordered, flagged, round_.settings.defences.outlier_action)
    if len(kept) < len(ordered):  # a dropped reply: the Gram's rows are the kept ones
        held = np.ix_(*[[i for i, u in enumerate(ordered) if any(k is u for k in kept)]] * 2)
        theta.dot, theta.sq = theta.dot[held], theta.sq[held]
        theta.by_tensor = {n: dots[held] for n, dots in theta.by_tensor.items()}
    return kept, agreement


def smoothed_agreement(history: RunHistory, source: str, server_round: int) -> float:
    """``source``'s agreement smoothed over its rounds before ``server_round`` (from the
    run's history, so a resumed run goes on with it); NaN where it has none."""
    value = math.nan
    for number, record in sorted(history.rounds.items()):
        found = record.agreement.get(source)
        if number < server_round and found is not None and math.isfinite(found):
            value = float(smoothed(found, value))
    return value


def record_diagnostics(
    round_: Round, updates: list[Update], theta: Gram | None, agreement: dict[str, float]
) -> None:
    """The updates' norms and, if on, their interference (θ's from ``theta``, the rest
    read from the spool) and each source's agreement (the direction check's, which the next
    rounds read back) into the round's record."""
    start = time.perf_counter()
    ordered = by_source(updates)  # rows alike every round
    found = round_diagnostics(
        [u.target.source for u in ordered],
        [u.spooled for u in ordered],
        round_.shapes,
        round_.settings.embedding_names,
        interference=round_.settings.interference,
        theta=theta,
    )
    if agreement:
        found["agreement"] = agreement
    round_.history.record_diagnostics(round_.number, found, time.perf_counter() - start)


def clip_for_privacy(round_: Round, combined: list[Spooled]) -> list[Spooled]:
    """``combined`` as central DP combines them (:mod:`dept_strategy.privacy`): one weight
    each, each clipped to ``dp-clip-norm``, their mean rescaled to a sum over the round's
    sampled sources; the round's ε recorded."""
    privacy, history = round_.settings.privacy, round_.history
    factors = []
    for spooled in combined:
        norms = update_norms(spooled, round_.settings.embedding_names)
        factors.append(privacy.clip_factor(math.sqrt(sum(v * v for v in norms.values()))))
    released = sum(1 for r in history.rounds.values() if r.privacy) + 1
    history.at(round_.number).privacy = {
        "epsilon": privacy.epsilon(released),
        "delta": privacy.delta,
        "noise_multiplier": privacy.noise_multiplier,
        "clip_norm": privacy.clip_norm,
        "released_rounds": released,
        "sampled": round_.sampled,
        "clipped": sum(1 for f in factors if f < 1),
    }
    share = len(combined) / round_.sampled  # the mean of len(combined) made a sum over sampled
    return [
        replace(s, weight=1.0, scale=s.scale * f * share)
        for s, f in zip(combined, factors, strict=True)
    ]


def by_source(updates: list[Update]) -> list[Update]:
    return sorted(updates, key=lambda u: u.target.source)


def largest_weight(outer: OuterOptimizer) -> float:
    """max |value| over the shared tensors, without a tensor-sized temporary of ``abs()``."""
    found = 0.0
    for tensor in outer.tensors().values():
        if tensor.numel():
            low, high = torch.aminmax(tensor)
            found = max(found, -float(low), float(high))
    return found
