"""communication counts bytes per client and compares them with the shared tensors."""

import json
from pathlib import Path

import pytest

from benchmarks.comparison.communication import coded_bytes, main, theory
from dept.config import load_config
from dept.train.sharing import initial_tensors
from tests.helpers import corpus, share_cache


def test_theory_is_the_shared_tensors() -> None:
    cfg = load_config({"model": "debug", "variant": "spec"})
    body = sum(t.numel() for t in initial_tensors(cfg)[0].values())

    assert theory(cfg, "none", 0) == (body * 4, body * 4)
    trim = load_config({"model": "debug", "variant": "trim"})
    down, up = theory(trim, "none", 100)
    assert down == (body + 100 * 64) * 4 and up == down + 100 * 4  # + the rows' int32 ids
    assert coded_bytes(1000, "fp16") == 2000


@pytest.mark.slow
def test_communication_quick(tmp_path: Path, node_cache: Path) -> None:
    corpus("en-shakespeare")
    out = tmp_path / "out"
    share_cache(tmp_path / "work" / "state", node_cache)  # the benchmark's --work/state

    args = ["--quick", "--variants", "trim,spec-opt", "--compressions", "none"]
    assert main([*args, "--out", str(out), "--work", str(tmp_path / "work")]) == 0

    result = json.loads((out / "communication.json").read_text())
    rows = {r["variant"]: r for r in result["runs"]}
    assert set(rows) == {"trim", "spec-opt"}
    for r in rows.values():
        assert r["clients"] == 2
        assert 1.0 <= r["ratio_down"] < 1.05 and 1.0 <= r["ratio_up"] < 1.05
        assert r["wire_up"] > r["ledger_up"] and r["reduction_vs_ddp"] > 1
    assert rows["trim"]["theory_up"] > rows["spec-opt"]["theory_up"]  # + V_k rows and ids
