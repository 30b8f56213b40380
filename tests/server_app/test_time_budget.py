"""A time-budgeted federation in process: a slowed node trains fewer steps in the same
round time, its reply says so, and the server weighs it by the tokens it trained."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message, MessageType

from client_app.app import app as client_app
from dept.config import ConfigError
from dept.wire import keys
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.helpers import debug_run_config, synthetic_sources
from tests.server_app.test_resume import CrashingGrid, ServerCrash

SECONDS, DELAY = 1.5, 0.3
NODES = [
    {"partition-id": 0, "num-partitions": 2},
    {"partition-id": 1, "num-partitions": 2, "step-delay-s": DELAY},  # the slow node
]


class RecordingGrid(LocalGrid):
    """LocalGrid that keeps every train message and its reply."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trains: list[tuple[Message, Message]] = []

    def _deliver(self, msg: Message) -> Message:
        reply = super()._deliver(msg)
        if msg.metadata.message_type == MessageType.TRAIN:
            self.trains.append((msg, reply))
        return reply


def _config(tmp_path: Path, cache: Path, **overrides) -> dict:
    return debug_run_config(
        tmp_path,
        cache,
        **{
            "sources-file": str(synthetic_sources(tmp_path, "latin", "greek")),
            "seq-len": 16,  # short steps: many fit in the budget
            "round-time-s": SECONDS,
            "max-local-steps": 40,
            **overrides,
        },
    )


def _arrays(msg: Message) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in msg.content.array_records[keys.ARRAYS].items()}


def test_a_slowed_node_trains_fewer_steps_and_weighs_by_its_tokens(
    tmp_path: Path, node_cache: Path
) -> None:
    config = _config(tmp_path, node_cache)
    grid = RecordingGrid(client_app, NODES, config)

    run_federation(grid, config)

    first = [
        (m, r)
        for m, r in grid.trains
        if m.content.config_records[keys.CONFIG][keys.SERVER_ROUND] == 1
    ]
    metrics = {
        str(r.content["info"][keys.SOURCE]): dict(r.content.metric_records[keys.METRICS])
        for _, r in first
    }
    fast, slow = metrics["synth-latin"], metrics["synth-greek"]
    assert 1 <= slow[keys.LOCAL_STEPS] <= SECONDS / DELAY < fast[keys.LOCAL_STEPS] <= 40, metrics
    for m in (fast, slow):  # the tokens it trained, and within budget + one step
        assert m[keys.NUM_EXAMPLES] == m[keys.LOCAL_STEPS] * 4 * 16
        step = m[keys.TRAIN_SECONDS] / m[keys.LOCAL_STEPS]
        assert m[keys.TRAIN_SECONDS] <= SECONDS + 2 * step + 0.1, m
    # FedAvg (outer lr 1): round 2's θ is round 1's minus the token-weighted mean of Δ
    sent = _arrays(first[0][0])
    deltas = [_arrays(r) for _, r in first]
    weights = [float(r.content.metric_records[keys.METRICS][keys.NUM_EXAMPLES]) for _, r in first]
    second = next(
        m for m, _ in grid.trains if m.content.config_records[keys.CONFIG][keys.SERVER_ROUND] == 2
    )
    got = _arrays(second)
    apart = 0.0
    for name, theta in sent.items():
        mean = sum(w * d[name].astype(np.float64) for w, d in zip(weights, deltas, strict=True))
        want = theta - mean / sum(weights)
        np.testing.assert_allclose(got[name], want, atol=2e-6, err_msg=name)
        plain = theta - sum(d[name].astype(np.float64) for d in deltas) / len(deltas)
        apart = max(apart, float(np.abs(plain - want).max()))
    assert apart > 1e-4, "equal weights would give another body: the test tells them apart"


def test_a_bad_budget_stops_the_run_before_any_message(tmp_path: Path) -> None:
    config = _config(tmp_path, None, **{"round-time-s": -2.0})
    grid = RecordingGrid(client_app, NODES, config)

    with pytest.raises(ConfigError, match="'round-time-s' must be >= 0"):
        run_federation(grid, config)
    assert grid.trains == []


class CrashingRecordingGrid(CrashingGrid, RecordingGrid):
    """Keeps every train message and its reply, and dies once round ``crash_round`` trained."""


def _first_body(grid: RecordingGrid, server_round: int) -> dict[str, np.ndarray]:
    return next(
        _arrays(m)
        for m, _ in grid.trains
        if m.content.config_records[keys.CONFIG][keys.SERVER_ROUND] == server_round
    )


@pytest.mark.slow
def test_a_budgeted_run_killed_mid_run_resumes_from_its_checkpoint(
    tmp_path: Path, node_cache: Path
) -> None:
    # Prepare: a budgeted 3-round run whose server dies once round 2 trained
    config = _config(tmp_path, node_cache, **{"num-server-rounds": 3})
    crashing = CrashingRecordingGrid(client_app, NODES, config, crash_round=2)
    with pytest.raises(ServerCrash):
        run_federation(crashing, config)
    # Execute
    resumed = RecordingGrid(client_app, NODES, {**config, "resume": True})
    out = run_federation(resumed, {**config, "resume": True}).out_dir
    # Assert: round 2 trains again from round 1's body, and the run ends
    rounds = [m.content.config_records[keys.CONFIG][keys.SERVER_ROUND] for m, _ in resumed.trains]
    assert rounds[0] == 2 and rounds[-1] == 3
    before, after = _first_body(crashing, 2), _first_body(resumed, 2)
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[n], after[n]) for n in before)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [0, 1, 2, 3]
    steps = [r.content.metric_records[keys.METRICS][keys.LOCAL_STEPS] for _, r in resumed.trains]
    assert all(1 <= s <= 40 for s in steps)
