"""python -m benchmarks.comparison.time_budget --quick: the slowed node trains fewer steps under a
budget, and the round no longer waits for it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks.comparison.time_budget import main
from tests.helpers import corpus, share_cache


@pytest.mark.slow
def test_quick_run_shortens_the_slow_nodes_rounds(tmp_path: Path, node_cache: Path) -> None:
    for name in ("en-shakespeare", "de-novels"):
        corpus(name)
    out, work = tmp_path / "out", tmp_path / "work"
    share_cache(work / "state", node_cache)

    assert main(["--quick", "--out", str(out), "--work", str(work)]) == 0

    result = json.loads((out / "time_budget.json").read_text())
    rows = result["runs"]
    assert {(r["arm"], r["round"]) for r in rows} == {
        (a, n) for a in ("fixed", "budget") for n in (1, 2)
    }
    for r in rows:
        assert r["tokens"] == r["steps"] * 4 * 16
        assert r["steps"] == 6 or r["arm"] == "budget"
    slow = [r for r in rows if r["slowed"] and r["arm"] == "budget"]
    assert all(1 <= r["steps"] < 6 for r in slow), slow
    walls = {arm: sum(a["round_wall_s"].values()) for arm, a in result["arms"].items()}
    assert walls["budget"] < walls["fixed"], walls
    with (out / "time_budget.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(rows) == 8
    assert "round-time-s" in (out / "time_budget.txt").read_text()
