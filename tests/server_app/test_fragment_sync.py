"""Partial synchronisation through the real apps in process: the same numbers as the whole
body where every fragment syncs every round, the bytes of only the synced fragments, and
an exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import ArrayRecord

from client_app.app import app as client_app
from dept.wire.fragments import partition, syncing
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.helpers import assert_same_training
from tests.server_app.test_resume import NODES, CrashingGrid, ServerCrash, _config, _final

# sampled sources (fraction 0.5 of 3), a momentum outer step and int8 with error feedback
SETTINGS = {
    "variant": "spec",
    "outer-optimizer": "nesterov",
    "outer-lr": 0.7,
    "compression": "int8",
}


def _run(tmp_path: Path, name: str, cache: Path, **overrides) -> Path:
    config = _config(tmp_path, name, cache, **{**SETTINGS, **overrides})
    return run_federation(LocalGrid(client_app, NODES, config), config).out_dir


@pytest.mark.parametrize(
    "shared",
    [{}, {"variant": "glob", "embedding-rows": "seen", "global-vocab-size": 600}],
    ids=["spec", "glob-seen-rows"],  # φ's seen rows travel beside the synced fragments
)
def test_fragments_that_all_sync_every_round_are_the_whole_body(
    tmp_path: Path, node_cache: Path, shared: dict
) -> None:
    whole = _final(_run(tmp_path, "whole", node_cache, **shared))
    split = _final(
        _run(tmp_path, "split", node_cache, fragments=2, **{"fragment-period": 1, **shared})
    )
    assert_same_training(split[0], whole[0], "cpu")
    assert_same_training(split[1], whole[1], "cpu")


def test_only_the_synced_fragments_travel(tmp_path: Path, node_cache: Path) -> None:
    # Prepare
    out = _run(tmp_path, "staggered", node_cache, fragments=2, **{"fragment-period": 2})
    body = _final(out)[1]
    parts = partition(body, 2)
    size = {  # bytes of each fragment, and of the whole body, as an ArrayRecord sends them
        f: ArrayRecord({n: t for n, t in body.items() if parts[n] == f}).count_bytes()
        for f in (0, 1)
    }
    whole = ArrayRecord(dict(body)).count_bytes()
    partial_downs = 0
    # Execute
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # Assert: each reply carries its round's fragment (the last round: both); each message
    # all or one fragment
    last = lines[-1]["round"]
    for line in lines[1:]:
        synced = syncing(line["round"], 2, 2, last)
        assert len(synced) == (2 if line["round"] == last else 1)
        sent = sum(size[f] for f in synced)
        for row in line["sources"].values():
            if row["tokens"]:
                assert row["bytes_up"] < sent  # int8: codes + scales of those alone
                assert row["bytes_up"] > sent / 4
                assert row["bytes_down"] in (whole, size[0], size[1])
                partial_downs += row["bytes_down"] < whole
    assert partial_downs > 0


@pytest.mark.parametrize("outer", [pytest.param("nesterov", marks=pytest.mark.slow), "fedadam"])
def test_a_killed_run_with_fragments_resumes_exactly(
    tmp_path: Path, node_cache: Path, outer: str
) -> None:
    settings = {
        "fragments": 2,
        "fragment-period": 2,
        "outer-optimizer": outer,
        "outer-lr": {"nesterov": 0.7, "fedadam": 0.01}[outer],
    }
    expected = _final(_run(tmp_path, "reference", node_cache, **settings))
    interrupted = _config(tmp_path, "interrupted", node_cache, **{**SETTINGS, **settings})
    with pytest.raises(ServerCrash):
        run_federation(CrashingGrid(client_app, NODES, interrupted, crash_round=3), interrupted)
    resumed = {**interrupted, "resume": True}
    got = _final(run_federation(LocalGrid(client_app, NODES, resumed), resumed).out_dir)
    assert_same_training(got[0], expected[0], "cpu")
    assert_same_training(got[1], expected[1], "cpu")


def _no_screening_problems(out: Path) -> list[dict]:
    """Every clipped or rejected update of the run, from its summary and its rounds."""
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    screened = [u for line in lines for u in line["clipped"] + line["rejected"]]
    return summary["problems"] + screened


@pytest.mark.slow  # 100 local steps a source, each: 24 s of the fast tier's 150
@pytest.mark.parametrize(
    "settings",
    [
        # the run that logged 18 clippings: two fragments, each synced every other round
        {
            "fragments": 2,
            "fragment-period": 2,
            "num-server-rounds": 4,
            "local-steps": 25,
            "warmup-steps": 10,
            "fraction-train": 1.0,
        },
        # four fragments of the 4-layer tiny body, half the sources sampled: one left out of
        # a fragment's sync holds its Δ over more rounds
        {
            "model": "tiny",
            "fragments": 4,
            "fragment-period": 2,
            "num-server-rounds": 4,
            "local-steps": 25,
            "warmup-steps": 10,
            "fraction-train": 0.5,
        },
    ],
    ids=["2x2", "4x2-sampled"],
)
def test_honest_fragments_are_neither_clipped_nor_rejected(
    tmp_path: Path, node_cache: Path, settings: dict
) -> None:
    config = _config(tmp_path, "honest", node_cache, **{"variant": "spec-opt", **settings})
    out = run_federation(LocalGrid(client_app, NODES, config), config).out_dir
    assert _no_screening_problems(out) == []
