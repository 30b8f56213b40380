"""docker/loopback.sh, the five-minute deployment of docs/deployment.md, run as printed: a
SuperLink with TLS and SuperNode authentication, two SuperNodes, a run through them, a third
source joining mid-run, and nothing of it left running afterwards."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import with_venv_on_path

PROJECT = Path(__file__).resolve().parents[2]
SCRIPT = PROJECT / "docker" / "loopback.sh"


def _script(folder: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``bash docker/loopback.sh FOLDER`` in ``cwd``, in a session of its own."""
    return subprocess.run(
        ["bash", str(SCRIPT), folder],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )


@pytest.mark.slow
def test_the_loopback_script_runs_a_federation_a_source_joins_and_nothing_is_left(
    tmp_path: Path,
) -> None:
    work = tmp_path / "loopback"

    done = _script(str(work), PROJECT, with_venv_on_path())

    logs = {p.name: p.read_text(errors="replace")[-1500:] for p in (work / "logs").glob("*.log")}
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], logs)
    assert "loopback: round 1 done; cyrillic joins" in done.stdout
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert set(summary["sources"]) == {"latin", "greek", "cyrillic"}
    joined = summary["sources"]["cyrillic"]["joined_round"]
    assert joined >= 2 and all(s["tokens_trained"] > 0 for s in summary["sources"].values())
    run_log = (work / "logs" / "run.log").read_text()
    first_asked = re.search(r"round (\d): training [^\n]*cyrillic", run_log)
    assert first_asked and int(first_asked.group(1)) == joined, run_log[-3000:]
    rounds = [
        json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    trained = [r["round"] for r in rounds if r["sources"].get("cyrillic", {}).get("tokens")]
    assert trained and trained[0] == joined, "it trains from the round it joined"
    assert "embeddings fresh" in (work / "logs" / "superexec-cyrillic.log").read_text()
    assert "loopback: cyrillic: joined in round" in done.stdout
    assert not _running_in(work)


def _running_in(work: Path) -> list[list[str]]:
    """The command lines of live processes that name ``work``."""
    running = (p.info for p in psutil.process_iter(["cmdline", "status"]))
    return [
        info["cmdline"]
        for info in running
        if info["status"] != psutil.STATUS_ZOMBIE and str(work) in " ".join(info["cmdline"] or [])
    ]


@pytest.mark.slow  # a SuperLink and two SuperNodes, then a run that fails at once
def test_a_run_that_ends_before_round_1_stops_the_script_at_once_with_its_last_lines(
    tmp_path: Path,
) -> None:
    # Prepare: flwr, but its `run` fails, naming the app it was given; started from a folder
    # that is not the checkout
    env = with_venv_on_path()
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "flwr").write_text(
        '#!/bin/sh\nif [ "$1" = run ]; then echo "no run of $2 here" >&2; exit 1; fi\n'
        f'exec "{shutil.which("flwr", path=env["PATH"])}" "$@"\n'
    )
    (shim / "flwr").chmod(0o755)
    env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    started = time.monotonic()

    # Execute
    done = _script("work", tmp_path, env)

    # Assert: the run's own last lines, at once, not after waiting out its 600 s
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert "loopback: the run ended before its round 1" in done.stderr
    assert f"no run of {PROJECT} here" in done.stderr, "the app is the script's checkout"
    assert time.monotonic() - started < 180
    assert (tmp_path / "work" / "logs" / "run.log").is_file(), "FOLDER is the caller's"
    assert not _running_in(tmp_path / "work")
