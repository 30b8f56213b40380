"""TRIM: which rows of the global embedding each source holds (V_k), asked once per source.

A source computes V_k from its own training text with the global tokenizer; the server
needs it to send that source only its rows. The first time a source is sampled its node
gets a ``query`` asking for the vocabulary; the ids (int32, counted as bytes sent up) are
kept for the rest of the run.
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from dept.wire import keys
from dept_strategy.history import RunHistory
from dept_strategy.inflight import Target
from dept_strategy.queries import send_queries
from dept_strategy.validation import RejectedReply, ReplyRows, check_vocabulary, reply_source

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

    def rows(self, source: str, row_tensors: tuple[str, ...], seen: bool) -> ReplyRows:
        """The φ rows a reply from ``source`` may name: its V_k, all of it or (``seen``)
        the rows its round saw."""
        if source not in self.ids:
            raise RejectedReply(f"no vocabulary is known for source {source!r}")
        return ReplyRows(row_tensors, self.num_rows, self.ids[source], seen)

    def ensure(
        self, grid: Grid, targets: dict[str, int], server_round: int, history: RunHistory
    ) -> dict[str, int]:
        """``targets`` whose V_k is known, asking for the missing ones; a source whose node
        cannot say goes into ``history``, as do the bytes received."""
        missing = [Target(n, s) for s, n in targets.items() if s not in self.ids]
        if missing:
            self._ask(grid, missing, server_round, history)
        return {s: n for s, n in targets.items() if s in self.ids}

    def _ask(
        self, grid: Grid, targets: list[Target], server_round: int, history: RunHistory
    ) -> None:
        queries = [(t, self._request(t.source)) for t in targets]
        replies, silent = send_queries(grid, queries, self.timeout_s)
        received = 0
        for target, reply in replies:
            if target is None:
                continue
            if reply.has_error():
                history.failed(server_round, target.node, reply.error.reason or "?", target.source)
                continue
            arrays = reply.content.array_records.get(keys.ARRAYS)
            received += arrays.count_bytes() if arrays is not None else 0
            try:
                self._learn(target.source, reply)
            except RejectedReply as exc:
                why = f"unusable vocabulary: {exc}"
                history.failed(server_round, target.node, why, target.source)
        for target in silent:
            why = f"no vocabulary within {self.timeout_s:.0f} s"
            history.failed(server_round, target.node, why, target.source)
        history.record_bytes_up(server_round, received)

    def _request(self, source: str) -> ConfigRecord:
        return ConfigRecord(
            {keys.RUN_ID: self.run_id, keys.SOURCE: source, keys.REQUEST: keys.VOCABULARY}
        )

    def _learn(self, source: str, reply: Message) -> None:
        """Keep ``source``'s V_k from ``reply``, or :class:`RejectedReply` saying why not."""
        if reply_source(reply.content) != source:
            raise RejectedReply(f"answered for {reply_source(reply.content)!r}")
        self.ids[source] = check_vocabulary(reply.content, self.num_rows)
        log.info(
            "source %s holds %d of %d embedding rows", source, len(self.ids[source]), self.num_rows
        )
