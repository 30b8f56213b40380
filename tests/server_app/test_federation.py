"""The real ServerApp logic and ClientApp in one process through LocalGrid (seconds, no Ray)."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, Message
from safetensors.torch import load_file

from client_app.app import app as client_app
from dept.model.build import build_model
from dept.model.roles import body_state
from dept.state.lock import LOCK_FILE
from dept.state.workspace import init_embeddings
from dept.wire import keys
from dept_strategy.discovery import NotEnoughNodes
from dept_strategy.strategy import DeptStrategy
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from server_app.run_status import ERROR_LOG, STATUS_FILE, read_status
from tests.helpers import corpus, debug_run_config


class RecordingGrid(LocalGrid):
    """Keeps the array keys of every message sent, to check what travels."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent_keys: list[set[str]] = []

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            if keys.ARRAYS in msg.content:  # discovery queries carry no arrays
                self.sent_keys.append(set(msg.content.array_records[keys.ARRAYS].keys()))
        return super().push_messages(messages)


def _sources_file(tmp_path: Path) -> Path:
    shakespeare = corpus("en-shakespeare")
    path = tmp_path / "sources.yaml"
    path.write_text(
        "sources:\n"
        "  - {name: synth-latin, path: 'builtin:synthetic-latin', vocab-size: 512}\n"
        "  - {name: synth-greek, path: 'builtin:synthetic-greek', vocab-size: 512}\n"
        f"  - {{name: en-shakespeare, path: '{shakespeare}', vocab-size: 1024, "
        "max-train-bytes: 300000}\n"
    )
    return path


def test_federation_lowers_bpb_and_keeps_embeddings_home(tmp_path: Path, node_cache: Path) -> None:
    sources = _sources_file(tmp_path)
    run_config = debug_run_config(tmp_path, node_cache, **{"sources-file": str(sources)})
    grid = RecordingGrid(
        client_app, [{"partition-id": i, "num-partitions": 3} for i in range(3)], run_config
    )

    result = run_federation(grid, run_config)

    out, summary = result.out_dir, result.summary
    assert summary == json.loads((out / "summary.json").read_text()), "what it wrote"
    body_keys = set(body_state(build_model("debug", 300, 64)))
    assert summary["avg_val_bpb"] < summary["initial_avg_val_bpb"]
    for name, source in summary["sources"].items():
        assert source["val_bpb"] < source["initial_val_bpb"], name
        assert source["tokens_trained"] == 2 * 8 * 4 * 64
    assert all(sent == body_keys for sent in grid.sent_keys), "only the body travels"
    assert set(load_file(str(out / "body.safetensors"))) == body_keys
    body_bytes = 4 * summary["body_params"]
    per_reply = summary["comm"]["bytes_up"] / (2 * 3)
    assert body_bytes <= per_reply <= 1.02 * body_bytes
    text = (out / "metrics.jsonl").read_text()
    assert "NaN" not in text and "NaN" not in (out / "summary.json").read_text(), "strict JSON"
    lines = [json.loads(x) for x in text.splitlines()]
    assert [x["round"] for x in lines] == [0, 1, 2]
    assert set(lines[2]["sources"]) == {"synth-latin", "synth-greek", "en-shakespeare"}
    assert (out / "val_bpb.png").stat().st_size > 0 and (out / "metrics.csv").is_file()
    [run_dir] = (tmp_path / "state" / "runs").iterdir()
    for name in summary["sources"]:
        last = run_dir / name / "round-0002"  # the state after the last round
        stored = load_file(str(last / "embeddings.safetensors"))
        fresh = init_embeddings({"input": tuple(stored["input"].shape)}, 0, name)
        assert not np.allclose(stored["input"].numpy(), fresh["input"].numpy()), name
        position = json.loads((last / "progress.json").read_text())["position"]
        assert position["offset"] + position["epoch"] > 0


def _nan_for_node(node: int):
    """A ClientApp that answers like the real one, except node ``node`` sends NaN updates."""

    def app(msg: Message, context) -> Message:
        reply = client_app(msg, context)
        if (
            msg.metadata.dst_node_id == node
            and reply.has_content()
            and keys.ARRAYS in reply.content
        ):
            arrays = reply.content.array_records[keys.ARRAYS]
            for name in arrays:
                arrays[name] = Array(np.full_like(arrays[name].numpy(), np.nan))
        return reply

    return app


def test_bad_clients_are_dropped_and_the_run_goes_on(tmp_path: Path, node_cache: Path) -> None:
    run_config = debug_run_config(
        tmp_path, node_cache, **{"num-server-rounds": 1, "min-available-nodes": 3}
    )
    nodes = [
        {"partition-id": 1, "num-partitions": 4},
        {"partition-id": 2, "num-partitions": 4},
        {"source": "lost", "path": str(tmp_path / "no-such-folder")},
    ]
    grid = LocalGrid(_nan_for_node(2), nodes, run_config)

    out = run_federation(grid, run_config).out_dir

    summary = json.loads((out / "summary.json").read_text())
    round_1 = json.loads((out / "metrics.jsonl").read_text().splitlines()[1])
    assert summary["rejected_updates"] == 1 and "NaN" in round_1["rejected"][0]["reason"]
    round_0 = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert "lost" in round_0["failed"][0]["reason"], "a broken node is reported before training"
    assert summary["failed_replies"] == 2, "asked once per round, not once per message"
    assert summary["sources"]["synth-latin"]["tokens_trained"] > 0


def _synthetic_sources(tmp_path: Path) -> Path:
    path = tmp_path / "synthetic.yaml"
    path.write_text(
        "- {name: synth-latin, path: 'builtin:synthetic-latin', vocab-size: 512}\n"
        "- {name: synth-greek, path: 'builtin:synthetic-greek', vocab-size: 512}\n"
    )
    return path


def _shared_run(
    tmp_path: Path, cache: Path, variant: str, **overrides: object
) -> tuple[dict, RecordingGrid]:
    run_config = debug_run_config(
        tmp_path / variant,
        cache,
        variant=variant,
        **{
            "sources-file": str(_synthetic_sources(tmp_path)),
            "global-vocab-size": 600,
            **overrides,
        },
    )
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    grid = RecordingGrid(client_app, nodes, run_config)
    return run_federation(grid, run_config).summary, grid


def test_glob_and_trim_share_embeddings_and_trim_sends_fewer_rows(
    tmp_path: Path, node_cache: Path
) -> None:
    every = {"embedding-rows": "all"}  # every row a source holds goes up: V_k < all
    glob, glob_grid = _shared_run(tmp_path, node_cache, "glob", **every)
    trim, trim_grid = _shared_run(tmp_path, node_cache, "trim", **every)

    for summary in (glob, trim):
        assert summary["rejected_updates"] == summary["failed_replies"] == 0
        for source in ("synth-latin", "synth-greek"):
            assert (
                summary["sources"][source]["val_bpb"]
                < (summary["sources"][source]["initial_val_bpb"])
            )
    assert all("input" in sent for sent in glob_grid.sent_keys), "GLOB sends the whole φ"
    assert all("input" in sent for sent in trim_grid.sent_keys), "TRIM sends φ rows"
    assert trim["comm"]["bytes_down"] < glob["comm"]["bytes_down"]
    assert trim["comm"]["bytes_up"] < glob["comm"]["bytes_up"]
    trimmed = load_file(str(tmp_path / "trim" / "out" / "embeddings.safetensors"))["input"]
    assert trimmed.shape[0] == 600, "the server keeps the whole global φ"


@pytest.mark.parametrize("variant", ["glob", "trim"])
def test_seen_rows_go_up_alone_and_the_run_learns(
    tmp_path: Path, node_cache: Path, variant: str
) -> None:
    for rows in ("all", "seen"):
        (tmp_path / rows).mkdir()
    runs = {
        rows: _shared_run(tmp_path / rows, node_cache, variant, **{"embedding-rows": rows})[0]
        for rows in ("all", "seen")
    }
    seen, every = runs["seen"], runs["all"]

    assert seen["rejected_updates"] == seen["failed_replies"] == 0
    for name, source in seen["sources"].items():
        assert source["val_bpb"] < source["initial_val_bpb"], name
    assert seen["comm"]["bytes_down"] == every["comm"]["bytes_down"], "φ goes down as before"
    assert seen["comm"]["bytes_up"] < every["comm"]["bytes_up"], "only the rows seen go up"
    out = tmp_path / "seen" / variant / "out"
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rounds[1:]:
        for name, source in row["sources"].items():
            assert source["embedding_rows_seen"] > 0, name
            assert source["embedding_update_seen_rms"] > 0, name
    kept = load_file(str(out / "embeddings.safetensors"))["input"]
    assert kept.shape[0] == 600, "the server keeps the whole global φ"


def test_int8_updates_learn_with_a_quarter_of_the_bytes_up(
    tmp_path: Path, node_cache: Path
) -> None:
    # TRIM: θ and the V_k rows of φ are compressed, the row ids travel as int32
    variant = "trim"
    summary, _ = _shared_run(tmp_path, node_cache, variant, compression="int8")

    assert summary["rejected_updates"] == summary["failed_replies"] == 0
    for name, source in summary["sources"].items():
        assert source["val_bpb"] < source["initial_val_bpb"], name
    replies = 2 * 2  # rounds x sources
    float32 = summary["comm"]["bytes_down"] / replies  # θ (and rows) go down as float32
    per_reply = summary["comm"]["bytes_up"] / replies
    assert 3.5 < float32 / per_reply < 4.0, "int8 codes + a float32 scale per 256 values"
    [run_dir] = (tmp_path / variant / "state" / "runs").iterdir()
    for name in summary["sources"]:
        assert (run_dir / name / "round-0002" / "residual.safetensors").is_file(), name


def test_a_source_with_missing_data_fails_the_start_naming_it(tmp_path: Path) -> None:
    sources = tmp_path / "sources.yaml"
    sources.write_text("- {name: gone, path: /no/such/corpus}\n")
    # 1 s: how long every node must have failed before the start gives up (5 s by default)
    run_config = debug_run_config(
        tmp_path, **{"sources-file": str(sources), "wait-for-nodes-s": 1.0}
    )
    grid = LocalGrid(
        client_app,
        [{"partition-id": 0, "num-partitions": 2}, {"partition-id": 1, "num-partitions": 2}],
        run_config,
    )
    with pytest.raises(NotEnoughNodes, match=r"'gone'.*/no/such/corpus"):
        run_federation(grid, run_config)
    written = {p.name for p in (tmp_path / "out").iterdir()}
    # nothing but the run lock and why the run ended is written before it starts
    assert written == {LOCK_FILE, STATUS_FILE, ERROR_LOG}
    status = read_status(tmp_path / "out", 0)
    assert status is not None and status.state == "failed" and "'gone'" in status.error


def test_a_round_is_aggregated_without_the_body_it_sent(
    tmp_path: Path, node_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: watch every serialised copy of the shared tensors the ServerApp makes
    made: list[weakref.ref] = []
    serialise, aggregate = DeptStrategy.shared_tensors, DeptStrategy.aggregate_train

    def watched_serialise(self: DeptStrategy) -> Any:
        record = serialise(self)
        made.append(weakref.ref(record))
        return record

    alive_at_first_reply: list[int] = []

    def watched_aggregate(self: DeptStrategy, server_round: int, replies: Any) -> Any:
        def first_watched() -> Any:
            for number, reply in enumerate(replies):
                if number == 0:  # the messages are sent: nothing should hold what they carried
                    gc.collect()
                    alive_at_first_reply.append(sum(ref() is not None for ref in made))
                yield reply

        return aggregate(self, server_round, first_watched())

    monkeypatch.setattr(DeptStrategy, "shared_tensors", watched_serialise)
    monkeypatch.setattr(DeptStrategy, "aggregate_train", watched_aggregate)
    run_config = debug_run_config(tmp_path, node_cache, **{"local-steps": 2})
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    # Execute
    run_federation(LocalGrid(client_app, nodes, run_config), run_config)
    # Assert: each round's training messages were sent, then let go with their body
    assert alive_at_first_reply == [0, 0], alive_at_first_reply
    assert len(made) >= 4, "a copy for each round's training and evaluation"
