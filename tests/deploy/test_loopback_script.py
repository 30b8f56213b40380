"""docker/loopback.sh, the five-minute deployment of docs/deployment.md, run as printed: a
SuperLink with TLS and SuperNode authentication, two SuperNodes, a run through them, a third
source joining mid-run, and nothing of it left running afterwards."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.helpers import with_venv_on_path

PROJECT = Path(__file__).resolve().parents[2]
SCRIPT = PROJECT / "docker" / "loopback.sh"


@pytest.mark.slow
def test_the_loopback_script_runs_a_federation_a_source_joins_and_nothing_is_left(
    tmp_path: Path,
) -> None:
    work = tmp_path / "loopback"

    done = subprocess.run(
        ["bash", str(SCRIPT), str(work)],
        cwd=PROJECT,
        env=with_venv_on_path(),
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )

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
    running = (p.info for p in psutil.process_iter(["cmdline", "status"]))
    left = [
        info["cmdline"]
        for info in running
        if info["status"] != psutil.STATUS_ZOMBIE and str(work) in " ".join(info["cmdline"] or [])
    ]
    assert not left, f"still running: {left}"
