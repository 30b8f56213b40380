"""The examples that measure for longer than CI has start as printed: the full benchmarks
of docs/findings.md and ``dept compare`` / ``dept cpt`` at their default budgets. Each runs
where its docs say, until the line that shows its work under way (a round's bits per byte, a
training step, a measured row); then Ctrl-C stops it, and nothing it started may outlive it.

Their ``--quick`` forms are tested whole elsewhere; this holds the printed lines themselves:
their flags, the files they read from where they are run, and their first unit of work.
The benchmarks run from a folder laid out as the checkout's root (its ``benchmarks/corpora.yaml``
beside ``../shared/corpora``), so what they write lands there and not in this checkout; those
that read the shared corpora are skipped where the corpora are missing (a fresh clone in
CI). ``dept compare`` and ``dept cpt`` run in a user's folder that holds the
``my-sources.yaml`` their ``--help`` names; so does the help's GLOB run, whose progress is
in its ``run.log`` (``--no-stream``). docs/sources.md's run on four of the shared
corpora runs as its block is printed: the sources file it writes, then the run."""

# ruff: noqa: E501  (the examples are quoted whole, as printed)

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.deploy.loopback import wait_for
from tests.helpers import CORPORA, fenced_block, start_shell, with_venv_on_path

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# the help's sources: two small sources named as its examples name them
MY_SOURCES = """\
sources:
  - {name: de-novels, path: 'builtin:synthetic-latin', vocab-size: 400}
  - {name: ru-chekhov, path: 'builtin:synthetic-cyrillic', vocab-size: 400}
"""
FIRST_ROUND = r"round 0/\d+ done: avg val bpb \d"
# a comparison's first run under way: its first round ("[spec lr 0.004] round 0/27 done: avg
# val bpb …" from a DEPT run, "[std-0 lr 0.004] round 1: avg val bpb …" from a STD one), or a
# training step before it ("[std-0 lr 0.004] STD τ=0 round 1: step 10/40 (global 10) loss …",
# half a STD round sooner: a round line waits for its whole first round)
A_RUNS_ROUND = r"\] (round \d+(/\d+ done)?: avg val bpb \d|.*round \d+\S*: step \d+/\d+ \(global \d+\) loss \d)"
FIRST_LINE_S = 300.0  # on 2 busy cores; each shows it within 5-30 s on an idle machine
STOPPED_S = 60.0


class Example(NamedTuple):
    folder: str  # "checkout" (the docs: from the checkout's root) or "user"
    corpora: bool  # reads ../shared/corpora
    under_way: str  # the line that shows its work started
    script: str = ""  # the docs' block the example ends, run whole; else the example alone
    log: str = ""  # the file that shows its progress, where not the terminal


EXAMPLES = {
    "python -m benchmarks.overhead.client_overhead": Example(
        "checkout", True, r"round 1 en-shakespeare: step \d+/25 \(global \d+\) loss \d"
    ),
    "python -m benchmarks.overhead.round_overhead": Example("checkout", True, FIRST_ROUND),
    "python -m benchmarks.comparison.communication": Example("checkout", True, FIRST_ROUND),
    "python -m benchmarks.overhead.server_scaling": Example(
        "checkout", False, r"\(0\.8M\) x 2 streamed mean fast: [\d.]+ s, peak [\d.]+x body"
    ),
    "python -m benchmarks.comparison.compression": Example("checkout", True, FIRST_ROUND),
    "python -m benchmarks.comparison.poisoning": Example("checkout", False, FIRST_ROUND),
    "python -m benchmarks.overhead.data_scaling": Example(
        "checkout", False, r"0\.1 GB: written in \d+ s; preparing it in a fresh process"
    ),
    "python -m benchmarks.comparison.time_budget": Example("checkout", True, FIRST_ROUND),
    "dept compare --sources-file benchmarks/corpora.yaml --model tiny": Example(
        "checkout", True, A_RUNS_ROUND
    ),
    "dept cpt --sources-file benchmarks/corpora.yaml --held-out en-shakespeare": Example(
        "checkout", True, FIRST_ROUND
    ),
    "dept compare --sources-file my-sources.yaml --methods std-0.3,spec-opt --lrs 0.004 --jobs 4": Example(
        "user", False, r"\[spec-opt lr 0\.004\] round 0/\d+ done: avg val bpb \d"
    ),
    'dept compare --sources-file my-sources.yaml --budget bytes -c "keep-inner-optimizer=false"': Example(
        "user", False, A_RUNS_ROUND
    ),
    "dept cpt --sources-file my-sources.yaml --held-out de-novels --variant spec --cpt-steps 400": Example(
        "user", False, FIRST_ROUND
    ),
    "dept run -c \"model='gpt2:tiny' variant='glob' compression='int8'\" -c \"seed=1\" --no-stream": Example(
        "user", False, FIRST_ROUND, log="outputs/dept/run.log"
    ),
    "dept run -c \"sources-file='four.yaml' variant='spec-opt' model='debug' local-steps=30\"": Example(
        "checkout",
        True,
        FIRST_ROUND,
        fenced_block(ROOT / "docs" / "sources.md", "## Four shared corpora"),
    ),
}


def _folder(tmp_path: Path, kind: str) -> Path:
    """``checkout``: the checkout's root as the benchmarks read it, the shared corpora beside
    it; ``user``: a folder holding the help's ``my-sources.yaml``."""
    if kind == "user":
        (tmp_path / "my-sources.yaml").write_text(MY_SOURCES)
        return tmp_path
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "corpora.yaml", checkout / "benchmarks")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "corpora").symlink_to(CORPORA.resolve())
    return checkout


def _marked(mark: str) -> list[int]:
    """The processes whose environment holds ``mark``: what the example started."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _until_under_way(shell: subprocess.Popen[str], shown: Path, under_way: str) -> None:
    """Wait until a line of ``shown`` (the terminal, or the run's log) matches ``under_way``;
    fail if the example ends or takes too long first."""

    def text() -> str:
        return shown.read_text(errors="replace") if shown.is_file() else ""

    def seen() -> bool:
        ended = shell.poll() is not None  # read the output after checking
        if re.search(under_way, text()):
            return True
        assert not ended, f"exit {shell.poll()} before a line matching {under_way!r}:\n{text()}"
        return False

    try:
        wait_for(seen, FIRST_LINE_S, f"a line matching {under_way!r}")
    except TimeoutError as late:
        raise AssertionError(f"{late}:\n{text()[-3000:]}") from None


@pytest.mark.parametrize("command", list(EXAMPLES))
def test_a_long_example_starts_as_printed_and_ctrl_c_stops_all_of_it(
    command: str, tmp_path: Path
) -> None:
    example = EXAMPLES[command]
    if example.corpora and not (CORPORA / "en-shakespeare" / "train.txt").is_file():
        pytest.skip(f"reads ../shared/corpora, not present here ({CORPORA})")
    cwd = _folder(tmp_path, example.folder)
    mark = f"DEPT_EXAMPLE_{uuid.uuid4().hex}"
    env = with_venv_on_path(
        **{mark: "1", "FLWR_HOME": str(tmp_path / "flwr-home")},
        XDG_CACHE_HOME=str(tmp_path / "home-cache"),  # a dept run's default state
    )
    terminal = tmp_path / "terminal.txt"
    with terminal.open("w") as output:
        shell = start_shell(example.script or command, cwd, env, output)
    try:
        _until_under_way(shell, cwd / example.log if example.log else terminal, example.under_way)
        assert "Traceback" not in terminal.read_text(), terminal.read_text()
        os.killpg(shell.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        shell.wait(timeout=STOPPED_S)
        deadline = time.monotonic() + 10
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _marked(mark), f"left running after Ctrl-C: {_marked(mark)}"
    finally:
        for pid in [shell.pid, *_marked(mark)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shell.wait()
