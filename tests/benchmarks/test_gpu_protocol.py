"""benchmarks.gpu.protocol: the GPU command is the authors' regime at the planned size, and its
smoke version runs the whole comparison on a CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu import protocol as gpu_protocol
from dept_cli import compare
from tests.helpers import share_cache, synthetic_sources

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_command_is_the_authors_regime_in_five_rounds(tmp_path: Path) -> None:
    args = gpu_protocol.compare_args(
        gpu_protocol.argparse.Namespace(
            smoke=False, methods="std-0,glob", device="cuda", out=str(tmp_path)
        ),
        ROOT / "benchmarks" / "corpora.yaml",
    )
    parsed = compare.parse_args(args)
    base = compare.base_config(parsed, tmp_path)
    assert (base.model, base.seq_len, base.num_server_rounds, base.local_steps) == (
        "125m",
        2048,
        5,
        40,
    )
    assert (base.outer_optimizer, base.outer_lr, base.outer_momentum) == ("nesterov", 0.7, 0.7)
    assert (base.weight_decay, base.keep_inner_optimizer, base.grad_clip) == (0.0, False, 1.0)
    assert parsed.lrs == [6e-4] and base.device == "cuda"


@pytest.mark.slow  # four short runs: 8 s of the fast tier's 150
def test_the_smoke_protocol_runs_on_a_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path
) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    monkeypatch.setattr(compare.os, "sched_getaffinity", lambda pid: {0})
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)
    # fmt: off
    assert gpu_protocol.main(["--smoke", "--sources-file", str(sources), "--methods", "std-0,glob",
                              "--device", "cpu", "--out", str(out)]) == 0
    # fmt: on
    report = json.loads((out / "comparison.json").read_text())
    assert report["config"]["keep-inner-optimizer"] is False
    assert report["config"]["outer-optimizer"] == "nesterov"
    for method in ("std-0", "glob"):
        assert "error" not in report["methods"][method], method
        assert len(report["methods"][method]["curve"]) == 3  # round 0 and two rounds
