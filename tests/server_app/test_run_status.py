"""The ServerApp says how its run ended, in one line; its traceback stays out of the log."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from dept.config import ConfigError
from server_app.run_status import (
    ERROR_LOG,
    RunFailed,
    TracebackFilter,
    one_line,
    read_status,
    write_failed,
    write_finished,
)


def test_a_failure_is_one_line_and_its_traceback_a_file(tmp_path: Path) -> None:
    before = time.time()
    try:
        raise OSError("disk full\nsecond line")
    except OSError as exc:
        write_failed(tmp_path, exc)
    status = read_status(tmp_path, before)
    assert status is not None and status.state == "failed" and not status.config_error
    assert status.error == "OSError: disk full"
    assert 'raise OSError("disk full' in (tmp_path / ERROR_LOG).read_text()
    assert read_status(tmp_path, time.time() + 1) is None  # an earlier run's status


def test_a_config_error_is_its_own_words_and_not_resumable(tmp_path: Path) -> None:
    write_failed(tmp_path, ConfigError("config key 'lr': must be > 0"))
    status = read_status(tmp_path, 0)
    assert status is not None and status.config_error
    assert status.error == "config key 'lr': must be > 0"


def test_a_finished_run(tmp_path: Path) -> None:
    assert read_status(tmp_path, 0) is None
    write_finished(tmp_path)
    status = read_status(tmp_path, 0)
    assert status is not None and status.state == "finished" and status.error == ""


def test_one_line_of_an_exception_without_a_message() -> None:
    assert one_line(KeyError()) == "KeyError"


@pytest.mark.parametrize(("debug", "kept"), [("", False), ("1", True)])
def test_the_traceback_of_a_failed_run_only_with_debug(
    monkeypatch: pytest.MonkeyPatch, debug: str, kept: bool
) -> None:
    monkeypatch.setenv("DEPT_DEBUG", debug)
    try:
        raise RunFailed("no source could train")
    except RunFailed as exc:
        failed = logging.LogRecord("flwr", 40, "", 0, "raised", (), (RunFailed, exc, None))
    try:
        raise ValueError("other")
    except ValueError as exc:
        other = logging.LogRecord("flwr", 40, "", 0, "raised", (), (ValueError, exc, None))
    assert TracebackFilter().filter(failed) and TracebackFilter().filter(other)
    assert (failed.exc_info is not None) is kept
    assert other.exc_info is not None  # only a RunFailed's is dropped
