"""``dept run`` on the real runtime: Ctrl-C and SIGTERM mid-round stop every process of a
run and leave it resumable, in the foreground as in the background (``nohup dept run ... &``,
no terminal), while another run, on its own SuperLink, goes on to the end; ``--resume``
finishes a stopped one, each round once. The stopped and resumed run is ``dept run
--help``'s first and last examples, as printed, in a folder of the user's; the background one
is docs/outputs.md's TensorBoard example; the GLOB run that finishes beside it is then
exported and scored by the docs' examples."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from server_app.launch import EXAMPLES as LAUNCH_EXAMPLES
from server_app.local_runtime import processes_with, stop_processes
from tests.command_examples import all_examples
from tests.helpers import with_venv_on_path

PROJECT = Path(__file__).resolve().parents[2]
ROUNDS = 4
SETTINGS = (
    f"model='debug' num-server-rounds={ROUNDS} local-steps=6 warmup-steps=1 seq-len=64 "
    "batch-size=4 eval-bytes=8192"
)
STOP_WITHIN_S = 30
LAUNCH_EXAMPLE_COMMANDS = [line.split(" #")[0].strip() for line in LAUNCH_EXAMPLES.splitlines()[1:]]


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


def _command(out: Path, *settings: str) -> list[str]:
    """``dept run`` of a short run writing ``out``, with more ``settings``."""
    return [
        *(sys.executable, "-m", "dept_cli", "run", "--no-stream"),
        *("-c", f"{SETTINGS} output-dir='{out}' state-dir='{out}-state'", *settings),
    ]


def _env(home: Path) -> dict[str, str]:
    """A user's environment: this venv's commands, no Flower settings of the suite's, and
    the default state-dir under ``home``."""
    env = with_venv_on_path(XDG_CACHE_HOME=str(home / "home-cache"))
    return {k: v for k, v in env.items() if not k.startswith("FLWR_")}


@dataclass
class Run:
    """A ``dept run`` process and the file its output goes to."""

    process: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text()


def _launch(command: list[str], cwd: Path, log: Path) -> Run:
    with log.open("a") as output:
        process = subprocess.Popen(
            command, cwd=cwd, env=_env(log.parent), stdout=output, stderr=subprocess.STDOUT
        )
    return Run(process, log)


def _printed(example: str, cwd: Path, log: str) -> Run:
    """``dept run --help``'s ``example``, as printed, in the user's folder ``cwd``."""
    return _launch(["bash", "-c", f"exec {example}"], cwd, cwd / log)


def _when_checkpointed(out: Path, server_round: int, run: Run) -> None:
    deadline = time.monotonic() + 300
    while not (out / "checkpoints" / f"round-{server_round:04d}").is_dir():
        assert run.process.poll() is None, run.text()[-3000:]
        assert time.monotonic() < deadline, f"no round {server_round} checkpoint in {out}"
        time.sleep(0.2)


def _stop(run: Run, out: Path, signum: int, after_round: int, shown: str) -> None:
    """Send ``signum`` mid-round; the run must end within the limit, leaving nothing, and
    say how to resume it (the output folder ``shown`` as the user gave it)."""
    assert list(_their_flower_home(out)), "the run's processes carry its Flower home"
    sent = time.monotonic()
    run.process.send_signal(signum)
    run.process.wait(timeout=STOP_WITHIN_S + 10)
    assert time.monotonic() - sent < STOP_WITHIN_S, run.text()[-3000:]
    assert run.process.returncode == 128 + signum, run.text()[-3000:]
    assert list(_their_flower_home(out)) == [], "a process of the stopped run is alive"
    last = run.text().strip().splitlines()[-1]
    assert last == _stopped_line(shown, signum, after_round), run.text()[-3000:]


def _stopped_line(out: Path | str, signum: int, after_round: int) -> str:
    name = signal.Signals(signum).name
    return (
        f"dept run: stopped by {name}; resume after round {after_round} with: "
        f"dept run --resume {out}"
    )


def _finished(run: Run, out: Path) -> dict:
    """The summary of a run that ended well."""
    run.process.wait(timeout=600)
    assert run.process.returncode == 0, run.text()[-3000:]
    assert list(_their_flower_home(out)) == [], "a process of the finished run is alive"
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_ctrl_c_mid_round_stops_the_run_and_resume_finishes_it(tmp_path: Path, runs: list) -> None:
    """``dept run --help``'s first and last examples as printed: Ctrl-C after round 1, then
    ``--resume``. SIGTERM stops a run the same way: the background test below."""
    first, _, resume = LAUNCH_EXAMPLE_COMMANDS
    out = tmp_path / "outputs" / "spec"
    runs.append(out)
    started = _printed(first, tmp_path, "first.log")
    _when_checkpointed(out, 1, started)
    _stop(started, out, signal.SIGINT, after_round=1, shown="outputs/spec")
    assert started.text().strip().endswith(f"with: {resume}"), "the help's resume, as printed"

    resumed = _printed(resume, tmp_path, "resumed.log")
    summary = _finished(resumed, out)

    assert summary["rounds"] == 2
    # A clean stop is not a crash: no stale lock, no round-0 silence, no problem at all.
    warnings = [line for line in resumed.text().splitlines() if "WARNING" in line]  # streamed
    assert warnings == [], warnings
    assert summary["problems"] == [], summary["problems"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rounds = [json.loads(line)["round"] for line in lines]
    assert rounds == [0, 1, 2]  # each round once, in order


@pytest.mark.slow
def test_sigterm_stops_a_run_in_the_background_while_another_finishes_on_its_own_superlink(
    tmp_path: Path, runs: list
) -> None:
    # Prepare: what `nohup dept run ... &` in a script gives: SIGINT and SIGHUP ignored,
    # input from /dev/null, no controlling terminal, the log in a file; the run is
    # docs/outputs.md's TensorBoard example as printed, in a folder of the user's. Beside
    # it, at the same time, a run in the foreground.
    user, log = tmp_path / "bg-user", tmp_path / "nohup.out"
    out = user / "outputs" / "dept"
    other = tmp_path / "outputs" / "dept"  # where the docs' GLOB examples below read
    runs += [out, other]
    user.mkdir()
    (example,) = [c for c in all_examples() if c.startswith('dept run -c "tensorboard=true"')]
    foreground = _launch(
        _command(other, "-c", "variant='glob'"), PROJECT, tmp_path / "foreground.log"
    )
    with log.open("w") as output:
        shell = subprocess.Popen(
            ["bash", "-c", f"nohup {example} & wait $!"],
            cwd=user,
            env=_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    background = Run(shell, log)
    _when_checkpointed(out, 1, background)
    (dept,) = psutil.Process(shell.pid).children()
    # Execute
    dept.send_signal(signal.SIGTERM)
    # Assert
    assert shell.wait(timeout=STOP_WITHIN_S + 10) == 128 + signal.SIGTERM, log.read_text()
    last = log.read_text().strip().splitlines()[-1]
    shown = "outputs/dept"
    assert last == _stopped_line(shown, signal.SIGTERM, after_round=1), log.read_text()[-3000:]
    assert list(_their_flower_home(out)) == [], "a process of the stopped run is alive"
    assert list((out / "tensorboard").glob("events.out.tfevents.*")), "the example's events"
    summary = _finished(foreground, other)
    assert summary["rounds"] == ROUNDS, "the other run went on"
    assert summary["avg_val_bpb"] < summary["initial_avg_val_bpb"]
    ports = {
        re.search(r"SuperLink on (127\.0\.0\.1:\d+)", text).group(1)
        for text in (foreground.text(), log.read_text())
    }
    assert len(ports) == 2, "each run has a SuperLink of its own"
    # and the GLOB run's global model, as docs/outputs.md and dept eval --help print it
    for example in ("dept export outputs/dept --global", "dept eval outputs/dept --global"):
        (command,) = [c for c in all_examples() if c.startswith(example)]
        step = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=_env(tmp_path),
            capture_output=True,
            text=True,
        )
        assert step.returncode == 0, (command, step.stderr[-3000:])
    assert (tmp_path / "models" / "global" / "config.json").is_file()
    scores = json.loads((other / "eval" / "eval.json").read_text())["results"]
    assert "global" in {s["model"] for s in scores}, scores
