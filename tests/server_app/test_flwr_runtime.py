"""Through the real Flower simulation runtime: ``flwr run`` with a local SuperLink and Ray."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest

from server_app.launch import build_command
from server_app.local_runtime import local_runtime
from server_app.sizing import ClientShare, client_share, machine_cores

PROJECT = Path(__file__).resolve().parents[2]
CPU_ONLY = client_share(4, 0.0, 0, machine_cores())  # as dept run sizes four clients here


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
    command = build_command(PROJECT, overrides, num_nodes=4, share=CPU_ONLY, stream=True)
    # as a user runs it: no OMP_NUM_THREADS (the suite's one thread), so the clients' threads
    # are their CPU share alone
    user_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    with local_runtime(tmp_path / "flwr-home") as runtime:  # own ports; stopped after
        done = subprocess.run(
            command,
            cwd=PROJECT,
            env=runtime.env(user_env),
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
    threads = f"trains on cpu ({CPU_ONLY.cpus} thread{'' if CPU_ONLY.cpus == 1 else 's'})"
    assert log.count(threads) == 4, "each client trains on its share of the cores"


def test_launcher_command_sizes_the_federation() -> None:
    command = build_command(
        PROJECT,
        {"model": "debug", "output-dir": "/o", "tie-embeddings": True},
        num_nodes=9,
        share=ClientShare(gpus=0.25, cpus=2, at_once=4),
        stream=False,
    )
    assert command[:3] == ["flwr", "run", str(PROJECT)]
    assert "num-supernodes=9 client-resources-num-gpus=0.25 client-resources-num-cpus=2" in command
    assert 'model="debug" output-dir="/o" tie-embeddings=true' in command


@pytest.mark.slow
def test_a_killed_simulation_worker_stops_the_run_with_its_line_and_resume(
    tmp_path: Path,
) -> None:
    """Issue #49: kill -9 of one Ray ClientAppActor left three of four sources failing every
    later round, and the run ended 'finished' with exit 0."""
    out = tmp_path / "out"
    settings = (
        f"model='debug' num-server-rounds=5 local-steps=10 output-dir='{out}' "
        f"state-dir='{tmp_path / 'state'}'"
    )
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home")}
    run = subprocess.Popen(
        ["dept", "run", "-c", settings],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert run.stdout is not None
    lines: list[str] = []
    killed = False
    for line in run.stdout:
        lines.append(line)
        if not killed and "round 1/5 done" in line:
            actors = [
                p
                for p in psutil.Process(run.pid).children(recursive=True)
                if "ClientAppActor" in " ".join(p.cmdline())
            ]
            assert actors, "the simulation runs its clients on Ray actors"
            actors[0].kill()
            killed = True
    code = run.wait(timeout=600)
    log = "".join(lines)
    assert killed and code == 1, log[-3000:]
    [said] = [x for x in lines if x.startswith("dept run: error:")]
    assert "a simulation worker died in round" in said
    assert "resume after round" in said and "with: dept run --resume out" in said
    status = json.loads((out / "run-status.json").read_text())
    assert status["state"] == "failed" and "simulation worker died" in status["error"]
