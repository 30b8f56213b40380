"""One run per output folder: a second holder is refused by name, a dead one's lock is taken
over with a warning, and a folder that cannot be used is named with its config key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dept.config import ConfigError
from dept.lock import LOCK_FILE, FolderInUse, check_folder_free, exclusive_folder

HOLD = "import sys, time; from pathlib import Path; from dept.lock import exclusive_folder\n"
HOLD += "with exclusive_folder(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n"


def test_a_second_holder_stops_at_once_naming_the_first(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=rf"'output-dir': {tmp_path} is in use by pid "):
            check_folder_free(tmp_path)
        with pytest.raises(FolderInUse, match=str(holder.pid)), exclusive_folder(tmp_path):
            pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive_folder(tmp_path):  # the kernel let go of the dead holder's lock
        pass


def test_a_dead_holders_lock_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = {"pid": 999999, "host": "gone", "since": "yesterday", "command": "dept-run"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(stale))
    with exclusive_folder(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] != 999999
    assert "taking over the stale lock of pid 999999 on gone" in caplog.text
    assert (tmp_path / LOCK_FILE).read_text() == "", "a clean end leaves no holder"


def test_a_file_or_unwritable_folder_is_named_with_its_key(tmp_path: Path) -> None:
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=rf"config key 'output-dir': cannot use {afile}"):
        check_folder_free(afile)
    with pytest.raises(ConfigError, match="config key 'output-dir': cannot use"):
        check_folder_free(afile / "below")
