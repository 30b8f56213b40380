"""round_overhead splits every round's wall time and profiles one."""

import json
from pathlib import Path

import pytest

from benchmarks.overhead.round_overhead import main
from tests.helpers import corpus, share_cache


@pytest.mark.slow
def test_round_overhead_quick(tmp_path: Path, node_cache: Path) -> None:
    corpus("en-shakespeare")
    out = tmp_path / "out"
    for work in (tmp_path / "work", tmp_path / "work" / "profiled"):  # its two runs' state
        share_cache(work / "state", node_cache)

    assert main(["--quick", "--out", str(out), "--work", str(tmp_path / "work")]) == 0

    result = json.loads((out / "round_overhead.json").read_text())
    rounds = result["runs"]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["clients"] == 2 and 0 < r["training_s"] < r["wall_s"]
        parts = r["training_s"] + r["client_setup_s"] + r["evaluation_s"] + r["server_s"]
        assert abs(parts - r["wall_s"]) < 1e-6
    components = {p["component"]: p["seconds"] for p in result["profile"]}
    assert components["client: local training"] > 0 and components["client: build model"] > 0
    assert isinstance(result["met"], bool)
