"""How a run's end is told: ``run-status.json`` in its folder, and one line for a failure.

``flwr run`` exits 0 however the ServerApp ended, so the ServerApp writes, as its very last
act, whether the run finished or failed and why, in one line; ``dept run`` reads it to choose
its exit code and its advice. The traceback goes to ``error.log`` beside it, and to the log
stream only with ``DEPT_DEBUG=1`` (``dept run --debug``): Flower logs every ServerApp
exception with its traceback, so :class:`TracebackFilter` drops the traceback of a
:class:`RunFailed`, whose one line was already logged.
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from dept.config import ConfigError
from dept.state.disks import disk_note, no_space

log = logging.getLogger(__name__)
STATUS_FILE = "run-status.json"
ERROR_LOG = "error.log"
DEBUG_VARIABLE = "DEPT_DEBUG"


class RunFailed(RuntimeError):
    """The run ended on an error whose one line is the message (and was logged)."""


@dataclass(frozen=True)
class RunStatus:
    state: str  # "finished" or "failed"
    error: str  # one line; "" when finished
    config_error: bool  # the run config or its files were wrong: fix them, do not resume
    written: float  # time.time() when written

    def describe(self) -> str:
        return self.error or self.state


def one_line(exc: BaseException) -> str:
    """What went wrong, in one line: a config error's or a :class:`RunFailed`'s own words,
    else the type and message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, ConfigError | RunFailed):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def write_finished(out_dir: Path) -> None:
    _write(out_dir, RunStatus("finished", "", False, time.time()))


def write_failed(out_dir: Path, exc: BaseException) -> RunStatus:
    """Record ``exc`` as the run's end (``error.log`` holds its traceback), as far as the
    disk lets: on a full one the status (small) goes first, and what cannot be written is
    logged, not raised over ``exc``. A full disk is named in the line with its free space."""
    line = one_line(exc)
    if no_space(exc) and not isinstance(exc, RunFailed):  # the server's own disk: say which
        written = getattr(exc, "filename", None)  # an OSError's file, where it names one
        line = f"{disk_note(Path(written) if written else out_dir)}: {line}"
    status = RunStatus("failed", line, isinstance(exc, ConfigError), time.time())
    try:
        _write(out_dir, status)
        (out_dir / ERROR_LOG).write_text("".join(traceback.format_exception(exc)))
    except OSError as unwritten:
        log.error("could not record how the run ended in %s: %s", out_dir, unwritten)
    return status


def read_status(out_dir: Path, since: float) -> RunStatus | None:
    """The status a run wrote at or after ``since``; None if it wrote none (it was killed,
    or it never got to its folder)."""
    try:
        data = json.loads((out_dir / STATUS_FILE).read_text())
        status = RunStatus(
            str(data["state"]), str(data["error"]), bool(data["config_error"]), data["written"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return status if status.written >= since else None


def debugging() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


class TracebackFilter(logging.Filter):
    """Drops the traceback from a record about a :class:`RunFailed` (its line was logged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], RunFailed) and not debugging():
            record.exc_info, record.exc_text = None, None
        return True


def _write(out_dir: Path, status: RunStatus) -> None:
    tmp = out_dir / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps(status.__dict__, indent=2) + "\n")
    tmp.replace(out_dir / STATUS_FILE)
