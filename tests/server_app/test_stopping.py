"""``dept run`` on the real runtime: Ctrl-C and SIGTERM mid-round stop every process of a
run and leave it resumable, in the foreground as in the background (``nohup dept run ... &``,
no terminal), while another run, on its own SuperLink, goes on to the end; ``--resume``
finishes a stopped one, each round once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from server_app.local_runtime import processes_with, stop_processes

PROJECT = Path(__file__).resolve().parents[2]
ROUNDS = 4
SETTINGS = (
    f"model='debug' num-server-rounds={ROUNDS} local-steps=6 warmup-steps=1 seq-len=64 "
    "batch-size=4 eval-bytes=8192"
)
STOP_WITHIN_S = 30


def _their_flower_home(out: Path) -> Iterator[psutil.Process]:
    """The processes of the run writing ``out`` (all carry its Flower home)."""
    return processes_with("FLWR_HOME", str(out / ".flwr"))


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[Path]]:
    """Output folders for runs; whatever a failed test leaves of them is stopped."""
    folders: list[Path] = []
    yield folders
    for out in folders:
        stop_processes(lambda out=out: list(_their_flower_home(out)), 1.0, 10.0)


def _command(out: Path, *args: str) -> list[str]:
    """``dept run`` of a new run writing ``out``, or with ``--resume`` among ``args``."""
    command = [sys.executable, "-m", "dept_cli", "run", *args]
    if "--resume" not in args:
        command += ["-c", f"{SETTINGS} output-dir='{out}' state-dir='{out}-state'"]
    return command


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}


def _start(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        _command(out, "--no-stream", *args),
        cwd=PROJECT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _when_checkpointed(out: Path, server_round: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not (out / "checkpoints" / f"round-{server_round:04d}").is_dir():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no round {server_round} checkpoint in {out}"
        time.sleep(0.2)


def _stop(process: subprocess.Popen, out: Path, signum: int, after_round: int) -> str:
    """Send ``signum`` mid-round; the run must end within the limit, leaving nothing."""
    assert list(_their_flower_home(out)), "the run's processes carry its Flower home"
    sent = time.monotonic()
    process.send_signal(signum)
    _, err = process.communicate(timeout=STOP_WITHIN_S + 10)
    assert time.monotonic() - sent < STOP_WITHIN_S, err
    assert process.returncode == 128 + signum, err
    assert list(_their_flower_home(out)) == [], "a process of the stopped run is alive"
    assert err.strip().splitlines()[-1] == _stopped_line(out, signum, after_round), err
    return err


def _stopped_line(out: Path, signum: int, after_round: int) -> str:
    name = signal.Signals(signum).name
    return (
        f"dept run: stopped by {name}; resume after round {after_round} with: "
        f"dept run --resume {out}"
    )


def _finished(process: subprocess.Popen, out: Path) -> tuple[dict, str]:
    """The summary of a run that ended well, and what it printed."""
    stdout, err = process.communicate(timeout=600)
    assert process.returncode == 0, (stdout + err)[-3000:]
    assert list(_their_flower_home(out)) == [], "a process of the finished run is alive"
    return json.loads((out / "summary.json").read_text()), stdout


@pytest.mark.slow
def test_ctrl_c_mid_round_stops_the_run_and_resume_finishes_it(
    tmp_path: Path, runs: list
) -> None:
    """SIGTERM stops a run the same way: the background test below."""
    one = tmp_path / "one"
    runs.append(one)
    first = _start(one)
    _when_checkpointed(one, 1, first)
    _stop(first, one, signal.SIGINT, after_round=1)

    summary, printed = _finished(_start(one, "--resume", str(one)), one)

    assert summary["rounds"] == ROUNDS
    # A clean stop is not a crash: no stale lock, no round-0 silence, no problem at all.
    warnings = [
        line for line in (printed + (one / "run.log").read_text()).splitlines() if "WARNING" in line
    ]
    assert warnings == [], warnings
    assert summary["problems"] == [], summary["problems"]
    lines = (one / "metrics.jsonl").read_text().splitlines()
    rounds = [json.loads(line)["round"] for line in lines]
    assert rounds == list(range(ROUNDS + 1))  # each round once, in order


@pytest.mark.slow
def test_sigterm_stops_a_run_in_the_background_while_another_finishes_on_its_own_superlink(
    tmp_path: Path, runs: list
) -> None:
    # Prepare: what `nohup dept run ... &` in a script gives: SIGINT and SIGHUP ignored,
    # input from /dev/null, no controlling terminal, the log in a file; beside it, at the
    # same time, a run in the foreground
    out, log, other = tmp_path / "bg", tmp_path / "nohup.out", tmp_path / "other"
    runs += [out, other]
    foreground = _start(other)
    with log.open("w") as output:
        shell = subprocess.Popen(
            ["bash", "-c", 'nohup "$@" & wait $!', "bash", *_command(out)],
            cwd=PROJECT,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _when_checkpointed(out, 1, shell)
    (dept,) = psutil.Process(shell.pid).children()
    # Execute
    dept.send_signal(signal.SIGTERM)
    # Assert
    assert shell.wait(timeout=STOP_WITHIN_S + 10) == 128 + signal.SIGTERM, log.read_text()
    last = log.read_text().strip().splitlines()[-1]
    assert last == _stopped_line(out, signal.SIGTERM, after_round=1), log.read_text()[-3000:]
    assert list(_their_flower_home(out)) == [], "a process of the stopped run is alive"
    summary, printed = _finished(foreground, other)
    assert summary["rounds"] == ROUNDS, "the other run went on"
    ports = {
        re.search(r"SuperLink on (127\.0\.0\.1:\d+)", text).group(1)
        for text in (printed, log.read_text())
    }
    assert len(ports) == 2, "each run has a SuperLink of its own"
