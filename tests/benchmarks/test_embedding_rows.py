"""benchmarks.comparison.embedding_rows: the cells' settings, the summary against STD of the same
tying, the update sizes read from a run, and a small end-to-end run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.comparison import embedding_rows
from dept.config import load_config
from tests.helpers import share_cache, synthetic_sources


def test_every_cell_is_a_valid_run_config_of_its_methods() -> None:
    for cell in embedding_rows.CELLS:
        for method in cell.methods:
            variant = {"variant": method} if method in ("glob", "trim", "spec") else {}
            load_config({**cell.settings, **variant})  # a bad key or value raises
    assert {c.name for c in embedding_rows.CELLS if not c.tied} == {"untied-all", "untied-seen"}


def _run(cell: str, method: str, tied: bool, score: float) -> dict:
    sizes = {"seen_rms": 2.0, "unseen_rms": 1.0, "rows_seen": 10.0}
    return {
        "cell": cell,
        "method": method,
        "tied": tied,
        "sources": {"a": {"val_bpb": score}},
        "update_sizes": sizes,
    }


def test_each_cell_is_measured_against_std_of_its_own_tying() -> None:
    runs = [
        _run("all", "std-0.3", True, 2.0),
        _run("all", "std-0.3", True, 2.2),
        _run("untied-all", "std-0.3", False, 1.5),
        _run("seen", "glob", True, 2.2),
        _run("seen", "glob", True, 2.4),
        _run("untied-seen", "glob", False, 1.8),
    ]
    rows = {(r["cell"], r["method"]): r for r in embedding_rows.summarise(runs)}
    glob = rows["seen", "glob"]
    assert glob["mean"] == pytest.approx(2.3) and glob["seeds"] == 2
    assert glob["sd"] == pytest.approx(math.sqrt(0.02))
    assert glob["vs_std"] == pytest.approx(2.3 / 2.1 - 1)
    assert rows["untied-seen", "glob"]["vs_std"] == pytest.approx(1.8 / 1.5 - 1)
    assert math.isnan(rows["untied-seen", "glob"]["sd"]), "one seed: no spread"


def test_update_sizes_come_from_the_rounds_that_sent_rows(tmp_path: Path) -> None:
    lines = [
        {"round": 0, "sources": {"a": {"embedding_rows_seen": 0}}},
        {
            "round": 1,
            "sources": {
                "a": {
                    "embedding_rows_seen": 10,
                    "embedding_update_seen_rms": 2.0,
                    "embedding_update_unseen_rms": 1.0,
                },
                "b": {
                    "embedding_rows_seen": 30,
                    "embedding_update_seen_rms": 4.0,
                    "embedding_update_unseen_rms": 3.0,
                },
            },
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    sizes = embedding_rows.update_sizes(tmp_path)
    assert sizes == {"seen_rms": 3.0, "unseen_rms": 2.0, "rows_seen": 20.0}
    assert all(math.isnan(v) for v in embedding_rows.update_sizes(tmp_path / "none").values())


@pytest.mark.slow
def test_two_cells_run_end_to_end_and_reuse_what_finished(
    tmp_path: Path, node_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedding_rows.compare.os, "sched_getaffinity", lambda pid: {0})  # 1 thread
    sources = synthetic_sources(tmp_path, "latin", "greek")
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)
    argv = [
        "--sources-file", str(sources), "--model", "debug", "--tokens", "8192",
        "--local-steps", "4", "--seeds", "1", "--jobs", "1", "--global-vocab-size", "600",
        "--cells", "all,seen", "--out", str(out),
    ]  # fmt: skip
    assert embedding_rows.main(argv) == 0
    report = json.loads((out / "embedding_rows.json").read_text())
    cells = {(r["cell"], r["method"]) for r in report["summary"]}
    assert cells == {("all", m) for m in ("glob", "trim", "std-0.3", "spec")} | {
        ("seen", "glob"),
        ("seen", "trim"),
    }
    for row in report["summary"]:
        assert math.isfinite(row["mean"]), row
        if row["method"] in ("glob", "trim"):
            assert row["rows_seen"] > 0 and row["unseen_rms"] > 0, row
    assert (out / "embedding_rows.png").stat().st_size > 0
    table = (out / "embedding_rows.md").read_text()
    assert "| seen | yes | glob |" in table and "unseen / seen" in table
    wall = [r["wall_s"] for r in report["runs"]]
    assert embedding_rows.main(argv) == 0  # every run finished: reused, not trained again
    again = json.loads((out / "embedding_rows.json").read_text())
    assert [r["wall_s"] for r in again["runs"]] == wall
