"""One run per output folder: a second holder is refused by name, a dead one's lock is taken
over with a warning, and a folder that cannot be used is named with its config key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dept.config import ConfigError
from dept.state.lock import (
    LOCK_FILE,
    FolderInUse,
    check_folder_free,
    exclusive_folder,
    redacted,
    release_lock,
)
from tests.helpers import held_elsewhere


def test_a_second_holder_stops_at_once_naming_the_first(tmp_path: Path) -> None:
    with held_elsewhere(tmp_path) as pid:
        with pytest.raises(FolderInUse, match=rf"'output-dir': {tmp_path} is in use by pid {pid}"):
            check_folder_free(tmp_path)
        with pytest.raises(FolderInUse, match=str(pid)), exclusive_folder(tmp_path):
            pass
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


def test_a_folder_that_cannot_be_made_is_named_with_its_key(tmp_path: Path) -> None:
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=rf"config key 'output-dir': cannot use {afile}"):
        check_folder_free(afile)
    with pytest.raises(ConfigError, match="config key 'output-dir': cannot use"):
        check_folder_free(afile / "below")


def test_the_holders_command_keeps_no_token_or_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["flwr-serverapp", "--token", "a88a0bf2", "--run-config", "x=1", "--auth-secret=s3"]
    monkeypatch.setattr("sys.argv", argv)
    with exclusive_folder(tmp_path):
        command = json.loads((tmp_path / LOCK_FILE).read_text())["command"]
    assert command == "flwr-serverapp --token *** --run-config x=1 --auth-secret=***"
    assert redacted(["a", "--password"]) == ["a", "--password"]


def test_a_stopped_runs_lock_is_released_unless_someone_still_holds_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: a run stopped by dept run (its processes killed) left its holder behind
    stopped = {"pid": 999999, "host": "here", "since": "now", "command": "flwr-serverapp"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(stopped))
    # Execute: held elsewhere, it is left alone; then released
    with held_elsewhere(tmp_path):
        assert not release_lock(tmp_path)
    (tmp_path / LOCK_FILE).write_text(json.dumps(stopped))
    assert release_lock(tmp_path)
    # Assert: the resume that follows takes the folder without a stale-lock warning
    with exclusive_folder(tmp_path):
        pass
    assert "stale lock" not in caplog.text
