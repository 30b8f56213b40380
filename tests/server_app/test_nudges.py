"""A node that holds one reply back (as Flower 1.42's SuperNode does after a late reply from
an old run) is nudged, found behind, and from then on nudged with each message."""

from __future__ import annotations

import time
from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from server_app.arrivals import replies_as_they_arrive
from server_app.nudges import NodesBehind


@pytest.fixture(autouse=True)
def _as_server() -> None:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0


class BehindGrid:
    """Nodes answer at once, except those in ``behind``: each of their replies goes out only
    when the node's next message arrives."""

    def __init__(self, behind: set[int]) -> None:
        self.behind = behind
        self.out: dict[str, Message] = {}  # replies the SuperLink has
        self.held: dict[int, Message] = {}  # the reply each node behind holds back
        self.pushed: list[tuple[int, str]] = []  # (node, message type)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        assert isinstance(messages, list), "Flower's HTTP grid reads its argument twice"
        ids = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            msg.metadata.__dict__["_message_id"] = f"m{len(self.pushed)}"
            self.pushed.append((node, msg.metadata.message_type))
            reply = Message(RecordDict({"c": ConfigRecord({"n": node})}), reply_to=msg)
            if node in self.behind:
                if node in self.held:
                    held = self.held.pop(node)
                    self.out[held.metadata.reply_to_message_id] = held
                self.held[node] = reply
            else:
                self.out[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, ids: Iterable[str]) -> list[Message]:
        return [self.out.pop(i) for i in list(ids) if i in self.out]


def _train(nodes: Iterable[int]) -> list[Message]:
    return [Message(RecordDict(), dst_node_id=n, message_type="train") for n in nodes]


def _exchange(
    grid: BehindGrid, nudges: NodesBehind | None, timeout: float
) -> tuple[set[int], float]:
    started = time.monotonic()
    replies = replies_as_they_arrive(grid, _train([1, 2, 3]), timeout, 0.02, nudges)
    return {r.content["c"]["n"] for r in replies}, time.monotonic() - started


def test_a_node_holding_its_reply_back_is_nudged_then_nudged_with_each_message() -> None:
    # Prepare: node 3 holds one reply back, as after an old run's late reply
    grid = BehindGrid(behind={3})
    grid.held[3] = Message(RecordDict(), reply_to=_train([3])[0])  # the old run's
    nudges = NodesBehind("run", behind=set(), after_s=0.2)
    # Execute: without nudges node 3's reply never comes; with them it does
    alone, _ = _exchange(grid, None, timeout=0.5)
    first, first_s = _exchange(grid, nudges, timeout=30)
    grid.pushed.clear()
    second, second_s = _exchange(grid, nudges, timeout=30)
    # Assert
    assert alone == {1, 2}
    assert first == {1, 2, 3} and 0.2 <= first_s < 5, "nudged after the wait, not the timeout"
    assert nudges.behind == {3}
    assert second == {1, 2, 3} and second_s < 0.2, "nudged at once, so no wait"
    assert grid.pushed == [(1, "train"), (2, "train"), (3, "train"), (3, "query")]


def test_a_node_that_is_only_slow_is_not_nudged_before_twice_the_others_wait() -> None:
    nudges = NodesBehind("run", behind=set(), after_s=0.0)
    nudges.pushed(BehindGrid(set()), {1, 2})
    time.sleep(0.2)
    nudges.replied(1)  # node 1 took 0.2 s
    grid = BehindGrid(set())
    nudges.waiting(grid, {2}, any_reply=True)
    assert grid.pushed == [], "0.2 s is not yet twice node 1's 0.2 s"
    time.sleep(0.25)
    nudges.waiting(grid, {2}, any_reply=True)
    assert grid.pushed == [(2, "query")]


class RefusingGrid(BehindGrid):
    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        raise RuntimeError("500 Internal Server Error")


def test_a_nudge_the_superlink_refuses_does_not_end_the_round() -> None:
    nudges = NodesBehind("run", behind={2}, after_s=0.0)
    nudges.pushed(RefusingGrid(set()), {1, 2})
    assert set(nudges.nudged) == {2}, "tried once, not again at once"


class OvertakingGrid(BehindGrid):
    """Node 3 trains for ``train_s``: the query that nudges it right after its train message
    is answered first, so its training reply goes out only with a message that comes after
    the training is done."""

    def __init__(self, behind: set[int], train_s: float) -> None:
        super().__init__(behind)
        self.done_at = time.monotonic() + train_s

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            if (msg.metadata.dst_node_id, msg.metadata.message_type) != (3, "query"):
                ids += super().push_messages([msg])
                continue
            msg.metadata.__dict__["_message_id"] = f"m{len(self.pushed)}"
            self.pushed.append((3, "query"))
            if time.monotonic() >= self.done_at and 3 in self.held:
                held = self.held.pop(3)
                self.out[held.metadata.reply_to_message_id] = held
            ids.append(msg.metadata.message_id)
        return ids


def test_a_node_behind_whose_nudge_was_answered_first_is_nudged_again_within_seconds() -> None:
    # Prepare: node 3 is known behind and trains for 1.5 s; nudges wait the default 60 s
    grid = OvertakingGrid(behind={3}, train_s=1.5)
    nudges = NodesBehind("run", behind={3})
    # Execute
    replied, took_s = _exchange(grid, nudges, timeout=20)
    # Assert: nudged at 0, 1 and 3 s, not left for 60 s (stop 59's CI: 60 s a round)
    assert replied == {1, 2, 3} and 1.5 <= took_s < 5
    assert grid.pushed.count((3, "query")) == 3
