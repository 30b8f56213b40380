"""What the strategy makes of each reply before it counts: whose it is, whether it failed,
whether it may be used; every reply that does not count is logged and recorded with its
reason, so a round never loses one silently.

Training replies are decoded here (:meth:`Replies.decode_train`), spooled for the round
(:mod:`dept_strategy.spool`) and folded into its running mean (:mod:`dept_strategy.aggregate`)
straight from the message, those too large clipped or dropped (:meth:`Replies.screened`)
and the rest credited (:meth:`Replies.credit`); evaluation replies are range-checked
(:meth:`Replies.check_eval`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from dept.state.disks import disk_note, no_space
from dept.wire import keys
from dept.wire.compression import TOPK_DENSITY
from dept_strategy.aggregate import RunningMean
from dept_strategy.history import RunHistory
from dept_strategy.inflight import InFlight, Target
from dept_strategy.screening import Flagged, UpdateSizes
from dept_strategy.spool import RoundSpool, Spooled
from dept_strategy.validation import (
    RejectedReply,
    ReplyRows,
    check_train_reply,
    finite_metric,
    finite_metrics,
    record_of,
    reply_source,
)

# a reply the server could not write to its own disk: the round cannot stand without it
NOT_KEPT = "the server could not keep it on disk"

ExpectedShapes = Callable[[str], tuple[dict[str, tuple[int, ...]], ReplyRows | None]]


@dataclass(frozen=True)
class ReplyRules:
    """Where a round's training replies go once checked, and what each must be: the shapes
    and φ rows a source was sent (``expected``), the most tokens a round can train, the
    compression, the φ tensor names (sized apart), the spool, the running mean (None
    under a robust rule, which reads the spool instead), top-k's density, the units its
    tensors are sized in (fragments) and what weighs a sent φ row in its average."""

    expected: ExpectedShapes
    max_weight: float
    compression: str
    embedding_names: tuple[str, ...]
    spool: RoundSpool
    running: RunningMean | None
    density: float = TOPK_DENSITY
    units: dict[str, float] = field(default_factory=dict)  # UpdateSizes's, the same for all
    row_weight: str = "tokens"  # (embedding-row-weight): a sent φ row's weight in its average


@dataclass
class Update:
    """A decoded training reply waiting for the round's screening."""

    target: Target
    spooled: Spooled
    metrics: dict[str, float]
    bytes_up: int


class Replies:
    """Credits, checks and records the replies of one exchange (a round's train or evaluate);
    what does not count goes into the run's history (:class:`RunHistory`) with its reason."""

    def __init__(self, history: RunHistory, in_flight: InFlight, server_round: int) -> None:
        self.history, self.in_flight, self.round = history, in_flight, server_round
        # who answered with an error: the node may have restarted serving other data, so
        # discovery asks it again; the source may have lost its state
        self.erred: list[Target] = []

    def claim(self, reply: Message) -> Target | None:
        """Whom ``reply`` is from; None (logged, recorded) for unsolicited or duplicates."""
        target, why = self.in_flight.claim(reply)
        if target is None:
            self.history.ignored(self.round, reply.metadata.src_node_id, why)
        elif reply.has_error():
            self.failed(target, reply.error.reason or "?")
            self.erred.append(target)
            return None
        else:
            self._state_event(target, reply.content)
        return target

    def failed(self, target: Target, reason: str) -> None:
        self.history.failed(self.round, target.node, reason, target.source)

    def rejected(self, target: Target, why: str) -> None:
        self.history.rejected(self.round, target.node, why, target.source)

    def missing(self) -> None:
        """Sampled sources whose node did not answer within ``round-timeout-s``."""
        for target in self.in_flight.unanswered():
            self.failed(target, "no reply within the round timeout")

    def _state_event(self, target: Target, content: RecordDict) -> None:
        info = record_of(content, keys.INFO, ConfigRecord)
        event = str(info.get(keys.STATE_EVENT, "")) if info is not None else ""
        if event:
            self.history.state_event(self.round, target.node, event, target.source)

    def screened(
        self, updates: list[Update], flagged: dict[int, Flagged], action: str
    ) -> list[Update]:
        """The updates to combine: those not ``flagged`` as they are, the flagged ones
        (:func:`dept_strategy.screening.screen`) clipped to the round's median or, with
        ``action`` "reject", dropped; each flagged one recorded."""
        kept = []
        for index, update in enumerate(updates):
            flag = flagged.get(index)
            if flag is None:
                kept.append(update)
            elif action == "reject":
                self.rejected(update.target, flag.why)
            else:
                why = f"{flag.why}; scaled by {flag.shrink:.3g}"
                self.history.clipped(self.round, update.target.node, why, update.target.source)
                stats = update.spooled.stats.scaled(flag.shrink)
                scale = update.spooled.scale * flag.shrink  # clipped for size, then direction
                spooled = replace(update.spooled, scale=scale, stats=stats)
                kept.append(replace(update, spooled=spooled))
        return kept

    def credit(self, accepted: list[Update]) -> MetricRecord:
        """Record the accepted replies (their tokens count); the round's train metrics."""
        weight = sum(u.spooled.weight for u in accepted)
        loss = 0.0
        for update in accepted:
            stats = update.spooled.stats
            metrics = {**update.metrics, "update_rms": stats.body_rms, "update_max": stats.max_abs}
            self.history.record_train(self.round, update.target.source, metrics, update.bytes_up)
            loss += update.spooled.weight * update.metrics.get(keys.TRAIN_LOSS, math.nan)
        return MetricRecord({keys.TRAIN_LOSS: loss / weight, keys.NUM_EXAMPLES: weight})

    def take_train(self, replies: Iterable[Message], rules: ReplyRules) -> list[Update]:
        """The round's training replies that decode, each taken in (:meth:`decode_train`)
        and let go before the next is pulled from ``replies`` (which may be a stream), so
        the server holds one at a time."""
        updates = []
        for reply in replies:
            target = self.claim(reply)
            update = self.decode_train(reply, target, rules) if target is not None else None
            del reply  # the loop would hold it while the next one is pulled
            if update is not None:
                updates.append(update)
        return updates

    def decode_train(self, reply: Message, target: Target, rules: ReplyRules) -> Update | None:
        """The reply's Δ checked, decoded, spooled and offered to the running mean, read
        twice from the message's own bytes (first to check, size and spool it, then, once
        it is known to be whole, to fold it in if its turn has come); None (recorded) when
        it is refused."""
        arrays = record_of(reply.content, keys.ARRAYS, ArrayRecord)
        bytes_up = arrays.count_bytes() if arrays is not None else 0
        self.history.record_bytes_up(self.round, bytes_up)
        tally = UpdateSizes(rules.embedding_names, rules.units)
        try:
            check_source(reply.content, target)
            shapes, rows = rules.expected(target.source)
            checked = check_train_reply(
                reply.content, shapes, rules.max_weight, rows, rules.compression, rules.density
            )
            path, layout = rules.spool.write(tally.observe(checked.tensors()))
        except RejectedReply as exc:
            self.rejected(target, str(exc))
            return None
        except OSError as exc:  # the run stops after the round (server_app.no_progress)
            full = f"; {disk_note(rules.spool.folder)}" if no_space(exc) else ""
            self.rejected(target, f"{NOT_KEPT} ({exc}{full})")
            return None
        by_count = rules.row_weight == "occurrences"
        row_weights = checked.counts if by_count else None
        spooled = Spooled(
            path, checked.weight, checked.rows, tally.stats(), layout, 1.0, row_weights
        )
        if rules.running is not None:
            rules.running.offer(target.source, spooled, checked.tensors())
        return Update(target, spooled, checked.metrics, bytes_up)

    def check_eval(self, reply: Message, target: Target) -> dict[str, float] | None:
        """The reply's evaluation metrics, range-checked; None (recorded) when refused."""
        try:
            check_source(reply.content, target)
            return check_eval_metrics(reply.content)
        except RejectedReply as exc:
            self.rejected(target, str(exc))
            return None


def check_source(content: RecordDict, target: Target) -> None:
    said = reply_source(content)
    if said != target.source:
        raise RejectedReply(f"answered for source {said!r}, was asked for {target.source!r}")


# metric: the lowest value it can honestly take (bits per byte and losses are never negative,
# a perplexity is exp(loss) >= 1); every one present must also be finite
EVAL_FLOORS = {keys.VAL_BPB: 0.0, keys.VAL_LOSS: 0.0, keys.VAL_PPL: 1.0, keys.VAL_BYTES: 1.0}


def check_eval_metrics(content: RecordDict) -> dict[str, float]:
    """Finite, in-range evaluation metrics, or :class:`RejectedReply` naming the metric."""
    metrics = record_of(content, keys.METRICS, MetricRecord)
    if metrics is None:
        raise RejectedReply(f"no '{keys.METRICS}' record")
    for name, floor in EVAL_FLOORS.items():
        if name == keys.VAL_BPB or name in metrics:
            value = finite_metric(metrics, name)
            if value < floor:
                raise RejectedReply(f"'{name}' is {value:g}; it cannot be below {floor:g}")
    return finite_metrics(metrics)
