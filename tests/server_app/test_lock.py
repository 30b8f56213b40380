"""A second run on a held output-dir stops at once in the ServerApp and writes nothing there
(dept-run's own check: tests/server_app/test_launch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from client_app.app import app as client_app
from dept.state.lock import LOCK_FILE, FolderInUse
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.helpers import debug_run_config


def test_the_server_app_stops_before_any_work(
    tmp_path: Path, held_output: tuple[Path, int]
) -> None:
    out, pid = held_output
    config = debug_run_config(tmp_path, **{"output-dir": str(out)})
    grid = LocalGrid(client_app, [{"partition-id": 0, "num-partitions": 1}], config)
    with pytest.raises(FolderInUse, match=f"in use by pid {pid}"):
        run_federation(grid, config)
    assert [p.name for p in out.iterdir()] == [LOCK_FILE], "nothing else written there"
