"""download-compression in an in-process federation: fewer bytes down, every node on the
server's body (its digest), and a node given a wrong body fetches the whole one in the round."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from client_app.app import app as client_app
from dept.train import held_body
from dept.wire import keys
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.conftest import ProjectLog
from tests.helpers import debug_run_config

SOURCES = ("synth-latin", "synth-greek")


class DamagingGrid(LocalGrid):
    """Before round 3's train message to ``victim``, flips one value of the body that node
    holds, leaving the file's digest as it was: the node holds a wrong θ̂ and does not know."""

    def __init__(self, state: Path, victim: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state, self.victim, self.damaged = state, victim, False

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            config = msg.content.config_records.get(keys.CONFIG)
            if (
                msg.metadata.message_type == MessageType.TRAIN
                and config.get(keys.SERVER_ROUND) == 3
                and config.get(keys.SOURCE) == self.victim
                and not self.damaged
            ):
                self._damage()
        return super().push_messages(messages)

    def _damage(self) -> None:
        [path] = self.state.glob(f"runs/*/{self.victim}/{held_body.FILE}")
        with safe_open(str(path), "pt") as handle:
            digest = handle.metadata()[held_body.DIGEST]
        body = load_file(str(path))
        name = sorted(body)[0]
        body[name].view(-1)[0] += 1.0
        save_file(body, str(path), {held_body.DIGEST: digest})
        held_body._last = None  # the process's copy too: as a restarted node would
        self.damaged = True


def _always_asking(node: int):
    """The real ClientApp, but from round 2 node ``node`` asks for the whole body, always."""

    def app(msg: Message, context) -> Message:
        config = msg.content.config_records.get(keys.CONFIG)
        if msg.metadata.dst_node_id != node or config.get(keys.SERVER_ROUND, 0) < 2:
            return client_app(msg, context)
        if msg.metadata.message_type != MessageType.TRAIN:
            return client_app(msg, context)
        return Message(RecordDict({keys.INFO: ConfigRecord({keys.NEEDS_BODY: True})}), reply_to=msg)

    return app


def _run(tmp_path: Path, cache: Path, victim: str | None, **overrides: Any) -> tuple[dict, list]:
    app = overrides.pop("app", client_app)
    tmp_path.mkdir(parents=True, exist_ok=True)
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        "".join(
            f"- {{name: {s}, path: 'builtin:synthetic-{s[6:]}', vocab-size: 512}}\n"
            for s in SOURCES
        )
    )
    config = debug_run_config(
        tmp_path, cache, **{"sources-file": str(sources), "num-server-rounds": 3, **overrides}
    )
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    state = Path(config["state-dir"])
    grid = (
        DamagingGrid(state, victim, app, nodes, config) if victim else LocalGrid(app, nodes, config)
    )
    out = run_federation(grid, config).out_dir
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), rounds


def _held_digests(state: Path) -> set[str]:
    digests = set()
    for path in state.glob(f"runs/*/*/{held_body.FILE}"):
        with safe_open(str(path), "pt") as handle:
            digests.add(handle.metadata()[held_body.DIGEST])
    return digests


def test_int4_sends_the_change_down_and_learns_as_float32_does(
    tmp_path: Path, node_cache: Path
) -> None:
    plain, _ = _run(tmp_path / "none", node_cache, None)
    coded, rounds = _run(tmp_path / "int4", node_cache, None, **{"download-compression": "int4"})

    assert coded["failed_replies"] == coded["rejected_updates"] == 0
    down = [r["bytes_down"] for r in rounds[1:]]
    assert down[0] == plain["comm"]["bytes_down"] / 3, "round 1: every node gets the whole body"
    assert all(6 < down[0] / d < 8 for d in down[1:]), down
    assert len(_held_digests(tmp_path / "int4" / "state")) == 1, "every node holds one body"
    for name, source in coded["sources"].items():
        assert source["val_bpb"] == pytest.approx(plain["sources"][name]["val_bpb"], rel=0.005)


def test_a_node_given_a_wrong_body_fetches_the_whole_one_and_trains_that_round(
    tmp_path: Path, node_cache: Path, project_log: ProjectLog
) -> None:
    victim = SOURCES[1]
    # TRIM: each message also carries the source's φ rows, as float32 beside the change; its
    # reply only the rows its round saw
    trim = {
        "variant": "trim",
        "embedding-rows": "seen",
        "global-vocab-size": 600,
        "download-compression": "int8",
    }
    summary, rounds = _run(tmp_path, node_cache, victim, **trim)

    assert summary["failed_replies"] == summary["rejected_updates"] == 0
    assert rounds[3]["sources"][victim]["tokens"] > 0, "it trained in the round it was damaged"
    assert f"source {victim} does not hold the body" in project_log.text
    assert rounds[3]["bytes_down"] > 1.9 * rounds[2]["bytes_down"], "the whole body went down"
    assert len(_held_digests(tmp_path / "state")) == 1, "and it holds the server's body again"


def test_a_node_that_asks_again_is_refused_and_the_round_goes_on(
    tmp_path: Path, node_cache: Path
) -> None:
    _, rounds = _run(
        tmp_path, node_cache, None, app=_always_asking(2), **{"download-compression": "int8"}
    )

    assert rounds[2]["sources"][SOURCES[0]]["tokens"] > 0, "the other source trained"
    refused = {r["source"]: r["reason"] for r in rounds[2]["rejected"] + rounds[2]["failed"]}
    assert SOURCES[1] in refused, rounds[2]
    whole = rounds[1]["bytes_down"] / 2  # round 1 sends both sources the whole body
    assert whole < rounds[2]["bytes_down"] < 2 * whole, "two changes and one whole body, once"
