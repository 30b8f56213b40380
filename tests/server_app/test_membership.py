"""Nodes joining and leaving a running federation, in process (the loopback tests in
tests/deploy do the same through the real runtime): a node defined only by its node config
joins after round 1 and is trained from the next round; a node that drops out for a round
comes back with the embeddings it saved, not fresh ones."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest
from flwr.app import Message, MessageType

from client_app.app import app as client_app
from dept.wire import keys
from server_app.federation import SPOOL_DIR, run_federation
from server_app.local_grid import LocalGrid
from tests.helpers import debug_run_config, share_cache

SCRIPTS = ("latin", "cyrillic", "greek", "georgian")


def script_nodes(tmp_path: Path, scripts: tuple[str, ...], cache: Path) -> list[dict[str, object]]:
    """Deployment-style node configs, one built-in synthetic language each, sharing ``cache``."""
    return [
        {
            "source": script,
            "path": f"builtin:synthetic-{script}",
            "vocab-size": 300,
            "state-dir": str(share_cache(tmp_path / "state" / script, cache)),
        }
        for script in scripts
    ]


class ChangingGrid(LocalGrid):
    """Node 4 connects once round 1 is evaluated; node 1 is gone for round 2's training."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hidden = {4}

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n not in self.hidden]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        for msg in messages:
            if keys.CONFIG not in msg.content:
                continue
            server_round = msg.content.config_records[keys.CONFIG].get(keys.SERVER_ROUND)
            if msg.metadata.message_type == MessageType.EVALUATE and server_round == 1:
                self.hidden.clear()
            if msg.metadata.message_type == MessageType.TRAIN:
                self.down = {1} if server_round == 2 else set()
        return super().push_messages(messages)


def test_a_source_joins_and_a_node_returns_with_its_embeddings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, node_cache: Path
) -> None:
    run_config = debug_run_config(
        tmp_path, **{"num-server-rounds": 3, "local-steps": 4, "eval-bytes": 2048}
    )
    nodes = script_nodes(tmp_path, SCRIPTS, node_cache)
    grid = ChangingGrid(client_app, nodes, run_config)

    clients = logging.getLogger("dept.train.source_client")  # not propagated: Flower's handlers
    clients.addHandler(caplog.handler)
    try:
        out = run_federation(grid, run_config).out_dir
    finally:
        clients.removeHandler(caplog.handler)

    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = {r["round"]: {s for s, m in r["sources"].items() if m["tokens"]} for r in rounds}
    assert trained[1] == {"latin", "cyrillic", "greek"}
    assert trained[2] == {"cyrillic", "greek", "georgian"}
    assert trained[3] == set(SCRIPTS)
    assert {f["source"] for f in rounds[2]["failed"]} == {"latin"}  # its training and evaluation
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sources"]["georgian"]["joined_round"] == 2
    assert summary["sources"]["latin"]["joined_round"] == 1
    georgian = summary["sources"]["georgian"]
    assert georgian["evaluated_round"] == 3 and georgian["tokens_trained"] == 2 * 4 * 4 * 64
    # A node says once where a source's embeddings came from: fresh, as each started here.
    # Records, not lines: pytest may hand one to caplog twice (it also attaches caplog to
    # the loggers that do not propagate).
    said = {id(r): r.getMessage() for r in caplog.records if r.name == "dept.train.source_client"}
    for script in SCRIPTS:
        [line] = [m for m in said.values() if m.startswith(f"{script}: embeddings")]
        assert line.startswith(f"{script}: embeddings fresh"), line
    assert not [p for p in summary["problems"] if p["kind"] == "state"], (
        "latin, back after a round away, trained on from its own round-1 state"
    )
    runs = tmp_path / "state" / "latin" / "runs"
    [run_dir] = runs.iterdir()
    saved = sorted(p.name for p in (run_dir / "latin").glob("round-*"))
    assert saved == ["round-0001", "round-0003"]


class ForgetfulGrid(LocalGrid):
    """The node of ``latin`` loses its whole state folder before round 2's training."""

    def __init__(self, *args, state: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.state = state

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        for msg in messages:
            config = msg.content.config_records.get(keys.CONFIG)
            if msg.metadata.message_type == MessageType.TRAIN and config[keys.SERVER_ROUND] == 2:
                shutil.rmtree(self.state / "latin" / "runs", ignore_errors=True)
        return super().push_messages(messages)


def test_a_source_whose_state_is_lost_says_so_in_the_summary(
    tmp_path: Path, node_cache: Path
) -> None:
    run_config = debug_run_config(
        tmp_path, **{"num-server-rounds": 2, "local-steps": 4, "eval-bytes": 2048}
    )
    nodes = script_nodes(tmp_path, SCRIPTS[:2], node_cache)
    grid = ForgetfulGrid(client_app, nodes, run_config, state=tmp_path / "state")

    out = run_federation(grid, run_config).out_dir

    summary = json.loads((out / "summary.json").read_text())
    [event] = [p for p in summary["problems"] if p["kind"] == "state"]
    assert event["round"] == 2 and event["source"] == "latin"
    assert event["event"] == "fresh embeddings in round 2: state lost (no saved state)"
    assert summary["sources"]["latin"]["tokens_trained"] > 0, "it trained on, from scratch"
    assert summary["sources"]["latin"]["fresh_starts"] == [{"round": 2, "event": event["event"]}]
    assert summary["sources"]["cyrillic"]["fresh_starts"] == []
    assert not (out / SPOOL_DIR).exists(), "a finished run leaves no spool folder"
