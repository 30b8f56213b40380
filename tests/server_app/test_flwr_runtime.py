"""Through the real Flower simulation runtime: ``flwr run`` with a local SuperLink and Ray."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import psutil
import pytest

from server_app.launch import build_command
from server_app.sizing import ClientShare, client_share, machine_cores
from tests.command_examples import doc_examples, help_examples
from tests.helpers import fenced_block, start_shell, with_venv_on_path

PROJECT = Path(__file__).resolve().parents[2]
CPU_ONLY = client_share(4, 0.0, 0, machine_cores())  # as dept run sizes four clients here


@pytest.mark.slow
def test_the_readmes_quickstart_runs_as_printed(tmp_path: Path) -> None:
    """``dept run`` alone, in a user's folder: the default federation, through ``flwr run``,
    a local SuperLink and Ray (the install before it is the suite's own)."""
    (command,) = fenced_block(PROJECT / "README.md", "## Set up and run").splitlines()
    install, run = command.split(" && ")
    assert install == "pip install -e ."
    # as a user runs it: no OMP_NUM_THREADS (the suite's one thread), so the clients' threads
    # are their CPU share alone; the state in this test's folder, not the user's cache
    user_env = with_venv_on_path(XDG_CACHE_HOME=str(tmp_path / "home-cache"))
    user_env.pop("OMP_NUM_THREADS", None)
    env = {k: v for k, v in user_env.items() if not k.startswith("FLWR_")}
    done = subprocess.run(
        ["bash", "-c", run],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    summary = json.loads((tmp_path / "outputs" / "dept" / "summary.json").read_text())
    assert len(summary["sources"]) == 4, log[-3000:]
    assert summary["avg_val_bpb"] < summary["initial_avg_val_bpb"]
    rounds = summary["rounds"]
    assert f"round {rounds}/{rounds} done" in log and "validation bits per byte" in log
    threads = f"trains on cpu ({CPU_ONLY.cpus} thread{'' if CPU_ONLY.cpus == 1 else 's'})"
    assert log.count(threads) == 4, "each client trains on its share of the cores"

    # the next steps, as dept --help and docs/evaluation.md print them: a source's model out,
    # and every model scored again by lm-evaluation-harness
    export = next(c for c in help_examples() if c.startswith("dept export outputs/dept"))
    evaluate = next(c for c, where in doc_examples().items() if c == "dept eval outputs/dept")
    for command in (export, evaluate):
        step = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert step.returncode == 0, (command, step.stderr[-3000:])
    assert (tmp_path / "models" / "synth-greek" / "config.json").is_file()
    scores = json.loads((tmp_path / "outputs" / "dept" / "eval" / "eval.json").read_text())
    for score in scores["results"]:  # within 0.5% of what the run measured
        assert abs(score["bits_per_byte"] / score["run_bits_per_byte"] - 1) < 0.005, score
    assert {s["model"] for s in scores["results"]} == set(summary["sources"])


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
    later round, and the run ended 'finished' with exit 0. The run is docs/outputs.md's W&B
    example (offline) as printed, in a user's folder, and its resume line finishes it."""
    out = tmp_path / "outputs" / "dept"
    shown = [c for c, where in doc_examples().items() if where.startswith("docs/outputs.md")]
    (example,) = [c for c in shown if c.startswith("WANDB_MODE=offline dept run")]
    (resume,) = [c for c in shown if c.startswith("dept run --resume")]
    env = {
        **with_venv_on_path(XDG_CACHE_HOME=str(tmp_path / "home-cache")),  # the default state
        "FLWR_HOME": str(tmp_path / "flwr-home"),
    }
    run = start_shell(example, tmp_path, env)
    assert run.stdout is not None
    lines: list[str] = []
    killed = False
    for line in run.stdout:
        lines.append(line)
        if not killed and re.search(r"round 1/\d+ done", line):
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
    assert "resume after round" in said and said.strip().endswith(f"with: {resume}")
    status = json.loads((out / "run-status.json").read_text())
    assert status["state"] == "failed" and "simulation worker died" in status["error"]

    # as printed, without WANDB_MODE: offline still, as the run began (docs/outputs.md)
    resumed = subprocess.run(
        ["bash", "-c", resume], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3
    died = int(re.search(r"died in round (\d+)", said).group(1))  # type: ignore[union-attr]
    # what the dead worker's sources failed stays on the record; the resumed rounds failed none
    assert {(p["round"], p["kind"]) for p in summary["problems"]} <= {(died, "failed")}
    attempts = sorted(p.name for p in (out / "wandb").rglob("offline-run-*") if p.is_dir())
    assert len(attempts) == 2, attempts  # offline, each attempt writes a folder of its own
