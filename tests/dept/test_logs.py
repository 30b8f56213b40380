"""Flower's misleading notices are dropped by their exact template, nothing else is."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from collections.abc import Iterator
from logging import WARNING
from pathlib import Path

import pytest
from flwr.common.logger import log

from dept.logs import MISLEADING_NOTICES, drop_misleading_notices, not_misleading


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def flower_log() -> Iterator[Recorder]:
    """What Flower's logger lets through, with the filter installed (removed afterwards)."""
    flower = logging.getLogger("flwr")
    recorder = Recorder()
    flower.addHandler(recorder)
    drop_misleading_notices("flwr")
    drop_misleading_notices("flwr")  # a second install adds nothing
    try:
        yield recorder
    finally:
        flower.removeHandler(recorder)
        flower.removeFilter(not_misleading)


def test_the_actor_shutdown_notice_is_dropped_and_other_warnings_pass(
    flower_log: Recorder,
) -> None:
    log(WARNING, "Manually terminating %s", "ClientAppActor")
    log(WARNING, "Terminating %s after an error", "ClientAppActor")
    log(WARNING, {"not": "a string template"})

    assert flower_log.messages == [
        "Terminating ClientAppActor after an error",
        "{'not': 'a string template'}",
    ]
    assert logging.getLogger("flwr").filters.count(not_misleading) == 1


def test_flower_still_logs_each_notice_with_that_template() -> None:
    """A Flower upgrade that rewords a notice would make its filter dead: say so."""
    for template, module in MISLEADING_NOTICES.items():
        spec = importlib.util.find_spec(module)  # read, not imported: it would import Ray
        assert spec is not None and spec.origin is not None, module
        assert f'"{template}"' in Path(spec.origin).read_text(), (template, module)


def test_a_commands_log_shows_its_own_lines_and_not_alembics_plugins() -> None:
    """What ``dept cpt`` showed before its first line: importing an in-process federation
    (Flower's state, alembic with it) after the command's logging is set up."""
    script = (
        "import logging; from dept.logs import log_to_terminal; log_to_terminal(); "
        "import server_app.federation; logging.getLogger('cpt').info('pre-training')"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "pre-training\n"
