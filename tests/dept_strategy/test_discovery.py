import os
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import Error, Message
from flwr.proto.node_pb2 import NodeInfo

from dept.config import ConfigError
from dept_strategy.discovery import NotEnoughNodes, SourceDirectory
from dept_strategy.history import RunHistory
from dept_strategy.identity import load_source_keys
from server_app.local_grid import LocalGrid
from tests.helpers import directory_app


class ArrivingGrid(LocalGrid):
    """Node 2 connects ``delay`` seconds after the first look."""

    def __init__(self, app, delay: float) -> None:
        super().__init__(app, [{}, {}], {})
        self.delay, self.first_look = delay, None

    def get_node_ids(self):
        self.first_look = self.first_look or time.monotonic()
        return [1, 2] if time.monotonic() - self.first_look >= self.delay else [1]


class LossyGrid(LocalGrid):
    """Loses the first ``lose`` queries to each node in ``lossy`` (as Flower does when a
    ClientApp process dies) and holds every reply of ``held`` nodes until released."""

    def __init__(self, app, nodes: int, lossy: dict[int, int], held: set[int] = frozenset()):
        super().__init__(app, [{}] * nodes, {})
        self.lossy, self.held = dict(lossy), set(held)
        self.sent: list[int] = []  # the node of every query pushed
        self.on_hold: dict[str, Message] = {}

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            self.sent.append(node)
            if self.lossy.get(node, 0) > 0:
                self.lossy[node] -= 1
                msg.metadata.__dict__["_message_id"] = f"lost-{len(self.sent)}"
                ids.append(msg.metadata.message_id)
                continue
            [message_id] = super().push_messages([msg])
            if node in self.held:
                self.on_hold[message_id] = self._replies.pop(message_id)
            ids.append(message_id)
        return ids

    def release(self) -> None:
        self._replies.update(self.on_hold)
        self.on_hold, self.held = {}, set()


def _directory(wait_s: float) -> SourceDirectory:
    return SourceDirectory(run_id="r", min_nodes=0, wait_s=wait_s, query_timeout_s=5)


def _history() -> RunHistory:
    """Where the directory writes down the nodes that cannot say what they serve."""
    return RunHistory(body_params=0, local_steps=1)


def test_a_bad_first_node_does_not_end_the_wait_for_a_good_one() -> None:
    grid = ArrivingGrid(directory_app({2: ["de"]}), delay=1.5)
    history = _history()
    owners = _directory(wait_s=30).wait(grid, 0, history)
    assert owners == {"de": 2}
    assert history.rounds[0].failed == [{"node": "1", "reason": "ConfigError: source 'x': no data"}]


def test_gives_up_early_with_every_reason_when_no_node_can_serve() -> None:
    grid = LocalGrid(directory_app({2: []}), [{}, {}], {})
    started = time.monotonic()
    with pytest.raises(
        NotEnoughNodes, match=r"no connected node can serve a source: node 1: .*no data"
    ):
        _directory(wait_s=2).wait(grid, 0, _history())
    assert time.monotonic() - started < 10


def test_a_forgotten_node_is_asked_again_next_round() -> None:
    served = {1: ["de"]}
    grid = LocalGrid(directory_app(served), [{}], {})
    directory = _directory(wait_s=2)
    assert directory.refresh(grid, 1, _history()) == {"de": 1}
    served[1] = ["fr"]  # the node restarted with other data
    assert directory.refresh(grid, 2, _history()) == {"de": 1}, "known nodes are not asked"
    directory.forget(1)
    assert directory.refresh(grid, 2, _history()) == {"fr": 1}


class KeyedGrid(LocalGrid):
    """Nodes that authenticated with the given public keys (PEM, as the SuperLink has them);
    ``connected`` can drop a node as if it went away."""

    def __init__(self, app, pem_by_node: dict[int, bytes]) -> None:
        super().__init__(app, [{}] * len(pem_by_node), {})
        self.pem_by_node = pem_by_node
        self.connected = set(pem_by_node)

    def get_node_ids(self):
        return sorted(self.connected)

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=self.pem_by_node[n]) for n in self.get_node_ids()]


def _key_pair() -> tuple[bytes, str]:
    """(PEM public key as Flower stores it, the same key in OpenSSH form for a pins file)."""
    public = ec.generate_private_key(ec.SECP384R1()).public_key()
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    ssh = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return pem, ssh.decode()


def test_the_first_node_keeps_a_source_and_a_second_claimant_is_refused() -> None:
    grid = KeyedGrid(directory_app({1: ["de"], 2: ["de"]}), {1: b"", 2: b""})
    directory = _directory(wait_s=2)
    assert directory.refresh(grid, 1, _history()) == {"de": 1}
    [conflict] = directory.conflicts
    assert conflict["refused_node"] == "2" and conflict["kept_node"] == "1"
    assert conflict["reason"] == "node 1 serves it already"
    assert directory.refresh(grid, 2, _history()) == {"de": 1}
    assert len(directory.conflicts) == 1, "a conflict is reported once"
    grid.connected = {2}  # the first node is gone: the other may take the source over
    assert directory.refresh(grid, 3, _history()) == {"de": 2}


def test_a_pinned_source_is_served_only_by_the_node_with_its_key(tmp_path: Path) -> None:
    # Prepare: node 1 (a stranger's key) answers first; node 2 holds de's key; node 3 none
    (stranger, _), (own, own_ssh) = _key_pair(), _key_pair()
    (tmp_path / "de.pub").write_text(own_ssh + "\n")
    pins = tmp_path / "pins.yaml"
    pins.write_text("de: de.pub\n")
    grid = KeyedGrid(
        directory_app({1: ["de"], 2: ["de"], 3: ["de"]}), {1: stranger, 2: own, 3: b""}
    )
    directory = SourceDirectory(
        run_id="r", min_nodes=0, wait_s=2, query_timeout_s=5, pinned=load_source_keys(pins)
    )
    # Execute
    owners = directory.refresh(grid, 1, _history())
    # Assert
    assert owners == {"de": 2}
    refused = {c["refused_node"]: c["reason"] for c in directory.conflicts}
    assert set(refused) == {"1", "3"}
    assert "is not the key de is pinned to (SHA256:" in refused["1"]
    assert "none: the node did not authenticate" in refused["3"]


def test_a_pins_file_that_is_not_keys_is_named(tmp_path: Path) -> None:
    pins = tmp_path / "pins.yaml"
    pins.write_text("de: ssh-ed25519 not-base64\n")
    with pytest.raises(ConfigError, match=r"'source-keys-file': .*pins.yaml, source de: not an"):
        load_source_keys(pins)
    pins.write_text("de: missing.pub\n")
    with pytest.raises(ConfigError, match=r"source de: .*missing\.pub"):
        load_source_keys(pins)


def test_a_node_restarted_under_a_new_id_takes_its_source_back() -> None:
    pem, _ = _key_pair()
    grid = KeyedGrid(directory_app({1: ["de"], 2: ["de"]}), {1: pem, 2: pem})
    grid.connected = {1}
    directory = _directory(wait_s=2)
    assert directory.refresh(grid, 1, _history()) == {"de": 1}
    grid.connected = {1, 2}  # node 2 is node 1 restarted; its old id is still listed
    assert directory.refresh(grid, 2, _history()) == {"de": 2}
    assert directory.refresh(grid, 3, _history()) == {"de": 2}, "it stays there"
    assert directory.conflicts == []


def test_nodes_with_random_bytes_for_keys_as_in_simulation(tmp_path: Path) -> None:
    grid = KeyedGrid(directory_app({1: ["de"], 2: ["fr"]}), {1: os.urandom(32), 2: os.urandom(32)})
    assert _directory(wait_s=2).refresh(grid, 1, _history()) == {"de": 1, "fr": 2}
    _, own_ssh = _key_pair()
    (tmp_path / "pins.yaml").write_text(f"de: {own_ssh}\n")
    pinned = SourceDirectory(
        run_id="r",
        min_nodes=0,
        wait_s=2,
        query_timeout_s=5,
        pinned=load_source_keys(tmp_path / "pins.yaml"),
    )
    assert pinned.refresh(grid, 1, _history()) == {"fr": 2}
    assert "its key (SHA256:" in pinned.conflicts[0]["reason"]


def test_a_lost_query_is_sent_again_so_a_resumed_run_gets_every_source() -> None:
    # Prepare: the resumed run expects de and fr; node 2's first two queries are lost
    grid = LossyGrid(directory_app({1: ["de"], 2: ["fr"]}), nodes=2, lossy={2: 2})
    directory = SourceDirectory(
        run_id="r", min_nodes=2, wait_s=30, query_timeout_s=600, reask_after_s=0.5
    )
    history = _history()
    started = time.monotonic()
    # Execute
    owners = directory.wait(grid, 0, history, expected=frozenset({"de", "fr"}))
    # Assert: asked again after 0.5 s, then after 1 s, instead of waiting out the timeout
    assert owners == {"de": 1, "fr": 2}
    assert grid.sent == [1, 2, 2, 2]
    assert time.monotonic() - started < 10
    reasons = [f["reason"] for f in history.rounds[0].failed]
    assert reasons[0].startswith("did not say which sources it serves: no answer to 1 query")
    assert len(reasons) == 2 and directory.pending == {}
    assert not any(q.silent or q.unanswered for q in directory.queries.values())


def test_a_late_answer_counts_in_a_later_round_and_a_silent_node_does_not_hold_a_round() -> None:
    grid = LossyGrid(directory_app({1: ["de"], 2: ["fr"]}), nodes=2, lossy={}, held={2})
    directory = SourceDirectory(
        run_id="r", min_nodes=0, wait_s=30, query_timeout_s=0.5, reask_after_s=60
    )
    assert directory.refresh(grid, 1, _history()) == {"de": 1}, "node 2 waited on 0.5 s"
    started = time.monotonic()
    assert directory.refresh(grid, 2, _history()) == {"de": 1}
    assert time.monotonic() - started < 0.4, "an asked node's silence is not waited on again"
    grid.release()  # the reply to the first query finally comes
    assert directory.refresh(grid, 3, _history()) == {"de": 1, "fr": 2}
    assert grid.sent == [1, 2], "node 2 was asked once: its late answer was taken"


class SlowGrid(LocalGrid):
    """Node 2's replies take ``delay_s`` to come back, as a cold ClientApp's do."""

    def __init__(self, app, delay_s: float) -> None:
        super().__init__(app, [{}, {}], {})
        self.delay_s = delay_s
        self.due: dict[str, float] = {}

    def push_messages(self, messages):
        ids = list(super().push_messages(messages))
        for message_id, msg in zip(ids, messages, strict=True):
            if msg.metadata.dst_node_id == 2:
                self.due[message_id] = time.monotonic() + self.delay_s
        return ids

    def pull_messages(self, message_ids):
        ready = [i for i in message_ids if self.due.get(i, 0.0) <= time.monotonic()]
        return super().pull_messages(ready)


def test_a_fresh_run_waits_for_every_node_it_asked_not_just_the_first_to_answer() -> None:
    grid = SlowGrid(directory_app({1: ["de"], 2: ["fr"]}), delay_s=1.0)
    directory = SourceDirectory(run_id="r", min_nodes=2, wait_s=30, query_timeout_s=600)
    assert directory.wait(grid, 0, _history()) == {"de": 1, "fr": 2}


def test_a_node_away_when_first_asked_is_asked_again_within_the_wait() -> None:
    served: dict[int, list[str]] = {1: ["de"]}  # node 2 answers an error while it is away
    app = directory_app(served)

    def returning(msg, context):
        reply = app(msg, context)
        served[2] = ["fr"]  # back after its first answer
        return reply

    grid = LocalGrid(returning, [{}, {}], {})
    directory = SourceDirectory(
        run_id="r", min_nodes=2, wait_s=30, query_timeout_s=600, reask_after_s=0.5
    )
    owners = directory.wait(grid, 0, _history(), expected=frozenset({"de", "fr"}))
    assert owners == {"de": 1, "fr": 2}


class AwayGrid(LossyGrid):
    """Node 2 is off the connected list while ``away`` is set (a partition)."""

    away = False

    def get_node_ids(self):
        return [n for n in super().get_node_ids() if not (self.away and n == 2)]


def test_a_node_back_from_away_is_asked_again_at_once_not_after_the_reask_wait() -> None:
    # Prepare: node 2 is known; it goes away and the query sent to it is lost
    grid = AwayGrid(directory_app({1: ["de"], 2: ["fr"]}), nodes=2, lossy={})
    directory = SourceDirectory(
        run_id="r", min_nodes=0, wait_s=30, query_timeout_s=0.5, reask_after_s=60
    )
    history = _history()
    assert directory.refresh(grid, 1, history) == {"de": 1, "fr": 2}
    grid.lossy[2] = 1
    directory.node_sources.pop(2)  # as after a resume: asked anew
    assert directory.refresh(grid, 2, history) == {"de": 1}, "its query lost"
    grid.away = True
    assert directory.refresh(grid, 3, history) == {"de": 1}
    # Execute: back, seconds later
    grid.away = False
    owners = directory.refresh(grid, 4, history)
    # Assert: asked again at once, not after 60 s, and why is written down
    assert owners == {"de": 1, "fr": 2}
    assert grid.sent == [1, 2, 2, 2]
    (reason,) = [f["reason"] for f in history.rounds[4].failed]
    assert reason.endswith(" s ago, before it was away"), reason


class PartitionedGrid(LossyGrid):
    """Node 2 drops off the connected list ``off_s`` seconds after the first look, for
    ``for_s`` seconds (Flower's missed heartbeats), then is back; its first query is lost."""

    def __init__(self, app, off_s: float, for_s: float, lose: int) -> None:
        super().__init__(app, nodes=2, lossy={2: lose})
        self.off_s, self.for_s, self.first_look = off_s, for_s, 0.0

    def get_node_ids(self):
        self.first_look = self.first_look or time.monotonic()
        since = time.monotonic() - self.first_look
        away = self.off_s <= since < self.off_s + self.for_s
        return [n for n in super().get_node_ids() if not (away and n == 2)]


@pytest.mark.parametrize("answer", ["lost", "Node Unavailable"])
def test_a_resumed_run_asks_a_node_back_from_a_partition_within_its_wait(answer: str) -> None:
    # node 2's query is lost in its partition, or Flower answers for it; the re-ask's own
    # wait (60 s) is longer than the run's
    served: dict[int, list[str]] = {1: ["de"], 2: ["fr"]}
    app = directory_app(served)

    def unavailable_once(msg, context):
        if msg.metadata.dst_node_id == 2 and not grid.sent.count(2) > 1:
            return Message(Error(code=0, reason="Node Unavailable"), reply_to=msg)
        return app(msg, context)

    lost = answer == "lost"
    grid = PartitionedGrid(app if lost else unavailable_once, off_s=0.2, for_s=0.4, lose=lost)
    directory = SourceDirectory(
        run_id="r", min_nodes=2, wait_s=5, query_timeout_s=600, reask_after_s=60
    )
    started = time.monotonic()
    owners = directory.wait(grid, 0, _history(), expected=frozenset({"de", "fr"}))
    assert owners == {"de": 1, "fr": 2}
    assert time.monotonic() - started < 5, "asked again once back, not after 60 s"
    assert grid.sent == [1, 2, 2]
