"""The ServerApp says how its run ended, in one line; its traceback stays out of the log."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from dept.config import ConfigError
from server_app.app import main as server_main
from server_app.launch import exit_code
from server_app.run_status import (
    ERROR_LOG,
    RunFailed,
    TracebackFilter,
    one_line,
    read_status,
    write_failed,
    write_finished,
)
from tests.conftest import ProjectLog
from tests.helpers import debug_run_config


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


def test_the_server_app_fails_in_one_line_and_flower_marks_it_failed(
    tmp_path: Path, project_log: ProjectLog
) -> None:
    context = Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={**debug_run_config(tmp_path), "lr": -1.0},
    )
    with pytest.raises(RunFailed) as failed:
        server_main(None, context)  # type: ignore[arg-type]  # fails before the grid is used
    assert str(failed.value).startswith("config key 'lr'")
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
    assert f"run failed: {failed.value}" in project_log.text


def _ended(out: Path, status: str, error: str = "", config_error: bool = False) -> None:
    (out / "run-status.json").write_text(
        json.dumps(
            {"state": status, "error": error, "config_error": config_error, "written": time.time()}
        )
    )


def test_dept_run_exits_as_the_run_ended(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    started = time.time() - 1
    assert exit_code(tmp_path, started, 0) == 1  # killed: no status at all
    assert "the run ended without writing" in capsys.readouterr().err
    _ended(tmp_path, "finished")
    assert exit_code(tmp_path, started, 0) == 0
    (tmp_path / "checkpoints" / "round-0002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "round-0002" / "state.json").write_text(
        json.dumps({"round": 2, "run_config": {}})
    )
    _ended(tmp_path, "failed", "OSError: disk full")
    assert exit_code(tmp_path, started, 0) == 1
    assert capsys.readouterr().err == (
        "dept run: error: OSError: disk full; resume after round 2 with: dept run --resume "
        f"{tmp_path}\n"
    )
    _ended(tmp_path, "failed", "config key 'lr': must be > 0", config_error=True)
    assert exit_code(tmp_path, started, 0) == 1  # a config error is not resumed
    assert capsys.readouterr().err == "dept run: error: config key 'lr': must be > 0\n"
