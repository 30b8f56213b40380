"""In Flower's simulation runtime a node slow to answer is queued behind others on a client
actor, not silent: the healthy run re-asks nobody, nudges nobody and records no problem. The
queue is forced (one actor serving every node in turn, each message taking its time) and the
deployment thresholds are made shorter than the wait, so the same run as a deployment would
misread it: the test shows both."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from flwr.app import Message

from dept_cli.in_process import in_process_grid
from dept_strategy import discovery
from server_app import federation, nudges
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.conftest import ProjectLog
from tests.helpers import debug_run_config

SERVICE_S = 0.4  # each message's turn on the one actor
THRESHOLD_S = 0.2  # the deployment heuristics' waits, shorter than a place in the queue


class OneActorGrid(LocalGrid):
    """Every node served by one actor, in the order messages were pushed: a reply shows
    once the messages before it and its own have had their turn."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.busy_until = 0.0
        self.ready_at: dict[str, float] = {}

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = list(super().push_messages(messages))
        for message_id in ids:
            self.busy_until = max(time.monotonic(), self.busy_until) + SERVICE_S
            self.ready_at[message_id] = self.busy_until
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        now = time.monotonic()
        due = [i for i in message_ids if self.ready_at.get(i, 0.0) <= now]
        return super().pull_messages(due)


@pytest.mark.parametrize(
    "simulation",
    [True, pytest.param(False, marks=pytest.mark.slow)],  # 14 s: the fast tier's limit
    ids=["simulation", "deployment"],
)
def test_a_queued_node_is_waited_for_not_nudged(
    tmp_path: Path,
    node_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    project_log: ProjectLog,
    simulation: bool,
) -> None:
    # Prepare: four nodes on one actor; the thresholds below a place in the queue
    monkeypatch.setattr(nudges, "NUDGE_AFTER_S", THRESHOLD_S)
    monkeypatch.setattr(discovery, "REASK_AFTER_S", THRESHOLD_S)
    monkeypatch.setattr(federation, "in_simulation", lambda grid: simulation)
    config = debug_run_config(
        tmp_path,
        node_cache,
        **{"num-server-rounds": 1, "local-steps": 2, "warmup-steps": 1, "round-timeout-s": 60.0},
    )
    grid = in_process_grid(config, OneActorGrid)
    # Execute
    summary = run_federation(grid, config).summary
    # Assert
    nudged = [r for r in project_log.records if "nudg" in r.getMessage()]
    warned = [r for r in project_log.records if r.levelno >= logging.WARNING]
    if simulation:
        assert not nudged and not warned, [r.getMessage() for r in nudged + warned]
        assert summary["problems"] == [], summary["problems"]
    else:  # the condition is real: the deployment heuristics misread this queue
        assert nudged or summary["problems"], "the queue was not long enough to mislead"
    assert all(s["tokens_trained"] for s in summary["sources"].values())
