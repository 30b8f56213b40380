"""A second run on a held output-dir stops at once, in the ServerApp and in dept-run, and
writes nothing there; a dept-run with an unusable output-dir names the key before Flower."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from client_app.app import app as client_app
from dept.lock import LOCK_FILE, FolderInUse
from server_app.federation import run_federation
from server_app.launch import main as dept_run
from server_app.local_grid import LocalGrid
from tests.helpers import debug_run_config

HOLD = "import sys, time; from pathlib import Path; from dept.lock import exclusive_folder\n"
HOLD += "with exclusive_folder(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n"


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """An output folder held by another living process (pid)."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
    try:
        yield out, holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_the_server_app_stops_before_any_work(tmp_path: Path, held: tuple[Path, int]) -> None:
    out, pid = held
    config = debug_run_config(tmp_path, **{"output-dir": str(out)})
    grid = LocalGrid(client_app, [{"partition-id": 0, "num-partitions": 1}], config)
    with pytest.raises(FolderInUse, match=f"in use by pid {pid}"):
        run_federation(grid, config)
    assert [p.name for p in out.iterdir()] == [LOCK_FILE], "nothing else written there"


def test_dept_run_refuses_before_starting_flower(
    held: tuple[Path, int], capsys: pytest.CaptureFixture
) -> None:
    out, pid = held
    assert dept_run(["-c", f"output-dir='{out}'"]) == 2
    assert f"dept-run: error: config key 'output-dir': {out} is in use by pid {pid}" in (
        capsys.readouterr().err
    )


def test_dept_run_names_an_output_dir_that_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    afile = tmp_path / "results"
    afile.write_text("not a folder")
    assert dept_run(["-c", f"output-dir='{afile}'"]) == 2
    assert f"config key 'output-dir': cannot use {afile} as a folder" in capsys.readouterr().err
