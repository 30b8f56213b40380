"""Resuming a comparison: a run's folder says which run config it ran (``plan.json``), so a
comparison stopped part way (Ctrl-C, a reboot) picks up where it was when the same command
runs again, and a changed command runs afresh. A federated run stopped part way goes on from
its newest checkpoint (its rounds, metrics and node state are all in its folder); a baseline
keeps no checkpoint and runs again from the start. A key added to the run config since a run
was planned counts as the behaviour the run had before the key existed: its default, unless
the key came with a new default (``embedding-rows``), so a comparison spread over
sessions is not run again for every key added between them, and a run of the old behaviour
is never taken for one of the new."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dept.config import DeptConfig, to_run_config
from dept.model.variants import variant
from dept.state.strict_json import dumps
from dept_cli.compare_plan import Plan
from dept_cli.methods import FEDERATED
from server_app.checkpoint import saved_run_config

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
        result = json.loads((out / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not _ran_this_plan(plan) or "error" in result:
        return None
    log.info("%s: reusing the finished run in %s", plan.label, out)
    return result


def stopped_after(plan: Plan) -> int | None:
    """The round after which an earlier comparison stopped this very federated plan, where
    its folder holds a checkpoint to go on from; None where the plan runs from the start (a
    baseline, another run config, no checkpoint)."""
    if plan.method not in FEDERATED or not _ran_this_plan(plan):
        return None
    saved = saved_run_config(Path(plan.out_dir))
    if saved is None:
        return None
    log.info("%s: going on after round %d in %s", plan.label, saved[0], plan.out_dir)
    return saved[0]


def _ran_this_plan(plan: Plan) -> bool:
    """Whether the plan's folder records a run of the same run config (keys added since at
    the behaviour that run had)."""
    try:
        ran = json.loads((Path(plan.out_dir) / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return False
    return _with_defaults(ran) == _with_defaults(json.loads(dumps(plan.run_config)))


# GLOB and TRIM sent every φ row each round until ``embedding-rows`` came (default ``seen``)
ROWS_BEFORE_THE_KEY = "all"


def _with_defaults(run_config: dict[str, Any]) -> dict[str, Any]:
    """``run_config`` with every key it lacks at the behaviour it ran (JSON-normalised)."""
    filled = {**json.loads(dumps(to_run_config(DeptConfig()))), **run_config}
    if "embedding-rows" not in run_config and variant(filled["variant"]).shares_embeddings:
        filled["embedding-rows"] = ROWS_BEFORE_THE_KEY
    return filled
