"""``dept compare``'s pool of worker processes: stopped with the comparison."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dept_cli.compare_plan import Plan

ROOT = Path(__file__).resolve().parents[2]
COMPARISON = """\
import sys
from pathlib import Path
from dept_cli.compare_pool import run_all
from tests.dept_cli.test_compare_pool import a_plan, train_for_an_hour
run_all([a_plan(Path(sys.argv[1]) / str(i)) for i in range(3)], 2, train_for_an_hour)
"""


def a_plan(out_dir: Path) -> Plan:
    return Plan("std-0", 0.004, {}, str(out_dir), 1, {})


def train_for_an_hour(plan: Plan) -> dict[str, Any]:
    """A run that would keep its worker busy long after the comparison was stopped."""
    Path(plan.out_dir).write_text(str(os.getpid()))
    time.sleep(3600)
    return {"wall_s": 3600.0}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_an_interrupt_of_the_comparison_alone_stops_its_runs(tmp_path: Path) -> None:
    """``kill -INT`` of the comparison (a scheduler's stop, ``timeout -s INT``) reaches it,
    not its workers: it must stop them, not wait for their runs to end."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    comparison = subprocess.Popen(
        [sys.executable, "-c", COMPARISON, str(tmp_path)], env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = [int(p.read_text()) for p in tmp_path.iterdir()]
        assert len(workers) == 2, "the two workers never started their runs"
        comparison.send_signal(signal.SIGINT)
        comparison.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [w for w in workers if _alive(w)], "workers left training"
        assert len(list(tmp_path.iterdir())) == 2, "a run started after the interrupt"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(comparison.pid, signal.SIGKILL)
        comparison.wait()
