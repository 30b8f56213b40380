"""Replies are handed to the strategy as they are pulled, and the wait is bounded."""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from server_app.arrivals import poll_interval, replies_as_they_arrive


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
        asked = set(ids)
        found = [m for m in self.pending if m.metadata.message_id in asked][:1]
        for msg in found:
            self.pending.remove(msg)
        return [Message(RecordDict({"c": ConfigRecord({"n": 1})}), reply_to=m) for m in found]


class AllInGrid(TrickleGrid):
    """Every reply is in by the first poll, each one made (and watched) when it is pulled."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[weakref.ref] = []

    def pull_messages(self, ids: Iterable[str]) -> list[Message]:
        replies = [
            Message(RecordDict({"c": ConfigRecord({"n": 1})}), reply_to=m)
            for m in self.pending
            if m.metadata.message_id in set(ids)
        ]
        self.pending = [m for m in self.pending if m.metadata.message_id not in set(ids)]
        self.made += [weakref.ref(r) for r in replies]
        return replies


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


def test_replies_that_all_arrived_together_are_held_one_at_a_time() -> None:
    grid = AllInGrid()
    alive_at_each = []
    for reply in replies_as_they_arrive(grid, _messages(4), timeout=10, poll_s=0):
        alive_at_each.append(sum(ref() is not None for ref in grid.made))
        del reply
    assert alive_at_each == [1, 1, 1, 1], "the one being handed over, never the poll's"


def test_a_sent_messages_content_is_let_go_once_pushed() -> None:
    from dept_strategy.inflight import InFlight, Target

    grid, in_flight = TrickleGrid(), InFlight()
    messages = _messages(2)
    for n in range(2):
        in_flight.track(messages[n], Target(n + 1, f"s{n}"))
    contents = [weakref.ref(m.content) for m in messages]
    stream = replies_as_they_arrive(grid, messages, timeout=10, poll_s=0)
    del messages
    first = next(stream)  # pushed; the grid keeps its own pending copies here, so pull them
    assert in_flight.claim(first) == (Target(1, "s0"), "")
    del first
    rest = list(stream)
    assert [in_flight.claim(r)[0] for r in rest] == [Target(2, "s1")]
    del rest
    assert all(ref() is None for ref in contents), "in flight keeps the ids, not the bodies"


def test_waiting_stops_at_the_timeout_with_what_arrived() -> None:
    grid = TrickleGrid(silent={"m1"})
    replies = list(replies_as_they_arrive(grid, _messages(3), timeout=0.3, poll_s=0.05))
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m2"]


class CountingGrid(TrickleGrid):
    """Message ids go on counting across pushes (TrickleGrid starts each push at m0)."""

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            ids.append(f"m{self.pulls}-{len(self.pending)}-{id(msg)}")
            msg.metadata.__dict__["_message_id"] = ids[-1]
            self.pending.append(msg)
        return ids


def test_a_reply_followed_up_is_replaced_by_the_reply_to_its_follow_up() -> None:
    grid = CountingGrid()
    asked: list[int] = []

    def again_for_node_2(reply: Message) -> Message | None:
        node = reply.metadata.src_node_id
        if node != 2 or asked:
            return None
        asked.append(node)
        return Message(RecordDict(), dst_node_id=2, message_type="train")

    stream = replies_as_they_arrive(
        grid, _messages(3), timeout=10, poll_s=0, follow_up=again_for_node_2
    )
    answered_nodes = [r.metadata.src_node_id for r in stream]

    assert asked == [2], "the first reply of node 2 was followed up"
    assert sorted(answered_nodes) == [1, 2, 3], "and node 2's second reply came in its place"


def test_a_few_missing_replies_are_pulled_often_and_many_less_often() -> None:
    assert poll_interval(1) == 0.25  # a small federation's round waits for no poll
    assert poll_interval(8) == 0.5
    assert poll_interval(500) == 1.0  # at most PULLS_PER_S requests a second
