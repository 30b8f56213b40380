"""Through the real Flower simulation runtime: ``flwr run`` with a local SuperLink and Ray."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from server_app.launch import build_command
from server_app.local_runtime import local_runtime

PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_flwr_run_simulation_debug_preset(tmp_path: Path) -> None:
    out = tmp_path / "out"
    overrides = {
        "model": "debug",
        "num-server-rounds": 2,
        "local-steps": 5,
        "warmup-steps": 2,
        "seq-len": 64,
        "eval-bytes": 8192,
        "output-dir": str(out),
        "state-dir": str(tmp_path / "state"),
    }
    command = build_command(PROJECT, overrides, num_nodes=4, gpus=0.0, stream=True)
    with local_runtime(tmp_path / "flwr-home") as runtime:  # own ports; stopped after
        done = subprocess.run(
            command,
            cwd=PROJECT,
            env=runtime.env(dict(os.environ)),
            capture_output=True,
            text=True,
            timeout=600,
        )

    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["sources"]) == 4, log[-3000:]
    assert summary["avg_val_bpb"] < summary["initial_avg_val_bpb"]
    assert "round 2/2 done" in log and "validation bits per byte" in log


def test_launcher_command_sizes_the_federation() -> None:
    command = build_command(
        PROJECT,
        {"model": "debug", "output-dir": "/o", "tie-embeddings": True},
        num_nodes=9,
        gpus=0.25,
        stream=False,
    )
    assert command[:3] == ["flwr", "run", str(PROJECT)]
    assert "num-supernodes=9 client-resources-num-gpus=0.25" in command
    assert 'model="debug" output-dir="/o" tie-embeddings=true' in command
