"""What the strategy makes of each reply before it counts: whose it is, whether it failed,
whether it may be used; every reply that does not count is logged and recorded with its
reason, so a round never loses one silently.

Training replies are decoded here (:func:`decode_train`) and spooled for the round
(:mod:`dept_strategy.aggregate`); evaluation replies are range-checked (:func:`check_eval`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import Message, RecordDict

from dept import keys
from dept_strategy.aggregate import RoundSpool, Spooled
from dept_strategy.history import RunHistory
from dept_strategy.inflight import InFlight, Target
from dept_strategy.validation import (
    RejectedReply,
    check_train_reply,
    finite_metric,
    finite_metrics,
    last_line,
    reply_source,
)

log = logging.getLogger(__name__)
ExpectedShapes = Callable[[str], tuple[dict[str, tuple[int, ...]], np.ndarray | None]]


@dataclass
class Arrival:
    """A decoded training reply waiting for the round's screening."""

    target: Target
    spooled: Spooled
    metrics: dict[str, float]
    bytes_up: int


class ReplyDesk:
    """Credits, checks and records the replies of one exchange (a round's train or evaluate)."""

    def __init__(
        self,
        history: RunHistory,
        in_flight: InFlight,
        server_round: int,
        on_error: Callable[[int], None] = lambda node: None,
    ) -> None:
        """``on_error(node)``: a node answered with an error (it may have restarted serving
        other data: the directory asks it again)."""
        self.history, self.in_flight, self.round = history, in_flight, server_round
        self.on_error = on_error

    def claim(self, reply: Message) -> Target | None:
        """Whom ``reply`` is from; None (logged, recorded) for unsolicited or duplicates."""
        target, why = self.in_flight.claim(reply)
        if target is None:
            node = reply.metadata.src_node_id
            log.warning("round %d: ignored a reply from node %d: %s", self.round, node, why)
            self.history.at(self.round).ignored.append({"node": str(node), "reason": why})
        elif reply.has_error():
            self.failed(target, reply.error.reason or "?")
            self.on_error(target.node)
            return None
        else:
            self._state_event(target, reply.content)
        return target

    def failed(self, target: Target, reason: str) -> None:
        log.warning(
            "round %d: source %s on node %d failed: %s",
            self.round,
            target.source,
            target.node,
            last_line(reason),
        )
        self.history.at(self.round).failed.append(
            {"node": str(target.node), "source": target.source, "reason": last_line(reason)}
        )

    def rejected(self, target: Target, why: str) -> None:
        self._note("rejected the reply for", self.history.at(self.round).rejected, target, why)

    def clipped(self, target: Target, why: str) -> None:
        self._note("clipped the update of", self.history.at(self.round).clipped, target, why)

    def _note(self, what: str, entries: list[dict[str, str]], target: Target, why: str) -> None:
        log.warning(
            "round %d: %s source %s from node %d: %s",
            self.round,
            what,
            target.source,
            target.node,
            why,
        )
        entries.append({"node": str(target.node), "source": target.source, "reason": why})

    def missing(self) -> None:
        """Sampled sources whose node did not answer within ``round-timeout-s``."""
        for target in self.in_flight.unanswered():
            self.failed(target, "no reply within the round timeout")

    def _state_event(self, target: Target, content: RecordDict) -> None:
        info = content.config_records.get(keys.INFO)
        event = str(info.get(keys.STATE_EVENT, "")) if info is not None else ""
        if event:
            log.warning("round %d: source %s: %s", self.round, target.source, event)
            self.history.at(self.round).state_events.append(
                {"node": str(target.node), "source": target.source, "event": event}
            )

    def decode_train(
        self,
        reply: Message,
        target: Target,
        spool: RoundSpool,
        expected: ExpectedShapes,
        max_weight: float,
        compression: str,
    ) -> Arrival | None:
        """The reply's Δ checked, decoded and spooled; None (recorded) when it is refused."""
        arrays = reply.content.array_records.get(keys.ARRAYS)
        bytes_up = arrays.count_bytes() if arrays is not None else 0
        self.history.record_bytes_up(self.round, bytes_up)
        try:
            check_source(reply.content, target)
            shapes, rows = expected(target.source)
            delta, weight = check_train_reply(reply.content, shapes, max_weight, rows, compression)
        except RejectedReply as exc:
            self.rejected(target, str(exc))
            return None
        try:
            spooled = spool.add(delta, weight, rows)
        except OSError as exc:  # a full disk costs this reply, not the round
            self.rejected(target, f"the server could not keep it on disk ({exc})")
            return None
        metrics = finite_metrics(reply.content.metric_records[keys.METRICS])
        return Arrival(target, spooled, metrics, bytes_up)

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
    metrics = content.metric_records.get(keys.METRICS)
    if metrics is None:
        raise RejectedReply(f"no '{keys.METRICS}' record")
    for name, floor in EVAL_FLOORS.items():
        if name == keys.VAL_BPB or name in metrics:
            value = finite_metric(metrics, name)
            if value < floor:
                raise RejectedReply(f"'{name}' is {value:g}; it cannot be below {floor:g}")
    return finite_metrics(metrics)
