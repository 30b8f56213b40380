"""Resuming a comparison: a run's folder says which run config it ran (``plan.json``), so a
comparison stopped part way (Ctrl-C, a reboot) picks up where it was when the same command
runs again, and a changed command runs afresh. A key added to the run config since a run
was planned counts as its default there: a new key's default keeps the old behaviour, so a
comparison spread over sessions is not run again for every key added between them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dept.config import DeptConfig, to_run_config
from dept_cli.compare_plan import Plan
from server_app.report import dumps

log = logging.getLogger(__name__)
PLAN_FILE = "plan.json"  # in a run's folder: the run config it ran with
RESULT_FILE = "result.json"  # in a run's folder: its normalised result, crashed or not


def record_plan(plan: Plan) -> None:
    """Write the run config ``plan`` runs with to its folder, before it starts."""
    (Path(plan.out_dir) / PLAN_FILE).write_text(dumps(plan.run_config, indent=2))


def finished_result(plan: Plan) -> dict[str, Any] | None:
    """The result an earlier comparison left in the plan's folder, if it ran this very plan
    (the same run config) to the end without an error."""
    out = Path(plan.out_dir)
    try:
        ran = _with_defaults(json.loads((out / PLAN_FILE).read_text()))
        same_plan = ran == _with_defaults(json.loads(dumps(plan.run_config)))
        result = json.loads((out / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not same_plan or "error" in result:
        return None
    log.info("%s: reusing the finished run in %s", plan.label, out)
    return result


def _with_defaults(run_config: dict[str, Any]) -> dict[str, Any]:
    """``run_config`` with every key it lacks at today's default (JSON-normalised)."""
    return {**json.loads(dumps(to_run_config(DeptConfig()))), **run_config}
