"""TRIM: which rows of the global embedding each source holds (V_k), asked once per source.

A source computes V_k from its own training text with the global tokenizer; the server
needs it to send that source only its rows. The first time a source is sampled its node
gets a ``query`` asking for the vocabulary; the ids (int32, counted as bytes sent up) are
kept for the rest of the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from dept import keys
from dept_strategy.inflight import InFlight, Target
from dept_strategy.validation import RejectedReply, check_vocabulary, reply_source

log = logging.getLogger(__name__)


class SourceVocabularies:
    """V_k per source, fetched on first need."""

    def __init__(self, *, run_id: str, num_rows: int, timeout_s: float) -> None:
        self.run_id = run_id
        self.num_rows = num_rows
        self.timeout_s = timeout_s
        self.ids: dict[str, np.ndarray] = {}

    def trimmed(self, source: str, arrays: ArrayRecord, phi: dict[str, np.ndarray]) -> ArrayRecord:
        """What ``source`` receives: ``arrays`` with the φ tensors (``phi``, decoded once per
        round) cut to its V_k rows; θ is the same payload, not a copy."""
        rows = self.ids[source]
        return ArrayRecord({n: Array(phi[n][rows]) if n in phi else arrays[n] for n in arrays})

    def expected(
        self, source: str, shapes: dict[str, tuple[int, ...]], row_tensors: tuple[str, ...]
    ) -> tuple[dict[str, tuple[int, ...]], np.ndarray]:
        """Shapes a reply from ``source`` must have, and the φ row ids it must name."""
        if source not in self.ids:
            raise RejectedReply(f"no vocabulary is known for source {source!r}")
        rows = self.ids[source]
        return {n: (len(rows), *s[1:]) if n in row_tensors else s for n, s in shapes.items()}, rows

    def ensure(
        self,
        grid: Grid,
        targets: dict[str, int],
        on_failure: Callable[[Target, str], None],
    ) -> tuple[dict[str, int], int]:
        """``targets`` whose V_k is known (asking for missing ones), and bytes received."""
        missing = {s: n for s, n in targets.items() if s not in self.ids}
        received = self._ask(grid, missing, on_failure) if missing else 0
        return {s: n for s, n in targets.items() if s in self.ids}, received

    def _ask(
        self, grid: Grid, targets: dict[str, int], on_failure: Callable[[Target, str], None]
    ) -> int:
        in_flight = InFlight()
        messages = []
        for source, node in targets.items():
            config = ConfigRecord(
                {keys.RUN_ID: self.run_id, keys.SOURCE: source, keys.REQUEST: keys.VOCABULARY}
            )
            message = Message(
                RecordDict({keys.CONFIG: config}), dst_node_id=node, message_type=MessageType.QUERY
            )
            in_flight.track(message, Target(node, source))
            messages.append(message)
        replies = list(grid.send_and_receive(messages, timeout=self.timeout_s))
        received = 0
        for reply in replies:
            target = in_flight.target_of(reply)
            if target is None:
                continue
            if reply.has_error():
                on_failure(target, reply.error.reason or "?")
                continue
            arrays = reply.content.array_records.get(keys.ARRAYS)
            received += arrays.count_bytes() if arrays is not None else 0
            try:
                if reply_source(reply.content) != target.source:
                    raise RejectedReply(f"answered for {reply_source(reply.content)!r}")
                self.ids[target.source] = check_vocabulary(reply.content, self.num_rows)
            except RejectedReply as exc:
                on_failure(target, f"unusable vocabulary: {exc}")
                continue
            log.info(
                "source %s holds %d of %d embedding rows",
                target.source,
                len(self.ids[target.source]),
                self.num_rows,
            )
        for target in in_flight.unanswered(r.metadata.reply_to_message_id for r in replies):
            on_failure(target, f"no vocabulary within {self.timeout_s:.0f} s")
        return received
