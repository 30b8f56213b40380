"""Replies are handed to the strategy as they are pulled, and the wait is bounded."""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from server_app.arrivals import replies_as_they_arrive


@pytest.fixture(autouse=True)
def _as_server() -> None:
    """Messages read the sender's identity from the process; here it plays the ServerApp."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0


class TrickleGrid:
    """Answers one pushed message per pull; never answers the ids in ``silent``."""

    def __init__(self, silent: set[str] = frozenset()) -> None:
        self.silent = silent
        self.pending: list[Message] = []
        self.pulls = 0

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"m{i}"
            ids.append(f"m{i}")
            if f"m{i}" not in self.silent:
                self.pending.append(msg)
        return ids

    def pull_messages(self, ids: Iterable[str]) -> list[Message]:
        self.pulls += 1
        if not self.pending:
            return []
        msg = self.pending.pop(0)
        return [Message(RecordDict({"c": ConfigRecord({"n": 1})}), reply_to=msg)]


def _messages(n: int) -> list[Message]:
    return [Message(RecordDict(), dst_node_id=i + 1, message_type="train") for i in range(n)]


def test_each_reply_is_yielded_as_it_arrives_and_can_be_dropped() -> None:
    grid = TrickleGrid()
    stream = replies_as_they_arrive(grid, _messages(3), timeout=10, poll_s=0)
    first = next(stream)
    assert first.metadata.reply_to_message_id == "m0" and grid.pulls == 1
    gone = weakref.ref(first)
    del first
    assert gone() is None, "the stream keeps no reference to a reply it handed over"
    rest = [r.metadata.reply_to_message_id for r in stream]
    assert rest == ["m1", "m2"] and grid.pulls == 3


def test_waiting_stops_at_the_timeout_with_what_arrived() -> None:
    grid = TrickleGrid(silent={"m1"})
    replies = list(replies_as_they_arrive(grid, _messages(3), timeout=0.3, poll_s=0.05))
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m2"]
