"""docs/running.md's plain ``flwr run``, as printed: Flower's own command on this app, with
no ``dept run`` in between, trains every round and writes the run's outputs.

Plain ``flwr run .`` starts a SuperLink on Flower's fixed ports (39091 and the next) and
leaves it running for the next run, as Flower means it to; on a shared machine those ports
may be anyone's. So the two lines run in a network namespace of their own (root's
``unshare``: CI runs as root), with a Flower home of their own, and whatever they left
running is stopped after."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from server_app.app_bundle import staged_app
from server_app.local_runtime import processes_with
from tests.command_examples import doc_examples
from tests.helpers import in_own_network, needs_own_network, with_venv_on_path

PROJECT = Path(__file__).resolve().parents[2]


def _the_docs_lines() -> list[str]:
    shown = [c for c, where in doc_examples().items() if where.startswith("docs/running.md")]
    env_line = next(c for c in shown if c.startswith("export FLWR_DISABLE_RUNTIME"))
    run_line = next(c for c in shown if c.startswith("flwr run . "))
    return [env_line, run_line]


@pytest.mark.slow  # a simulated federation through Flower's own command (about a minute)
@needs_own_network
def test_the_docs_plain_flwr_run_trains_every_round(tmp_path: Path) -> None:
    # Prepare: the app's files as a user's checkout holds them, and a home of its own
    app = staged_app(PROJECT, tmp_path / "app")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in with_venv_on_path(HOME=str(home)).items() if not k.startswith("FLWR_")}

    # Execute
    try:
        done = subprocess.run(
            in_own_network(*_the_docs_lines()),
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        left = list(processes_with("HOME", str(home)))  # the SuperLink flwr run leaves
        for process in left:
            process.send_signal(signal.SIGKILL)
        psutil.wait_procs(left, timeout=30)

    # Assert
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = app / "outputs" / "flwr"
    rounds = [
        json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    assert rounds == [0, 1, 2, 3]
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["variant"] == "spec-opt" and summary["avg_val_bpb"] < summary["initial_avg_val_bpb"]
    )
    assert left, "flwr run left its SuperLink running, as Flower does"
