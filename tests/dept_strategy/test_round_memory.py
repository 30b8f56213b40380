"""What a round holds does not grow with its replies: one body-sized sum and the reply being
read (traced by tracemalloc, which sees NumPy buffers and the messages' bytes); with
server-memory=lean, one of the two at a time."""

import math
import tracemalloc

import numpy as np
import pytest

from dept_strategy.outer import OuterOptimizer
from dept_strategy.screening import Defences
from tests.dept_strategy.mock_replies import mock_strategy, train_reply

SHAPES = {f"layer{i}": (256, 256) for i in range(16)}  # no tensor near the body size
BODY_BYTES = sum(math.prod(s) for s in SHAPES.values()) * 4


def _traced_peak(replies: int, rule: str, poisoned: bool, memory: str, tmp_path) -> float:
    """Peak bytes traced while the strategy takes ``replies`` made one at a time, in bodies."""
    import torch

    outer = OuterOptimizer({n: torch.zeros(s) for n, s in SHAPES.items()}, kind="fedavg")
    strategy = mock_strategy(
        outer=outer,
        spool_dir=tmp_path / str(replies),
        defences=Defences(aggregation=rule),
        server_memory=memory,
    )
    pool = np.random.default_rng(0).standard_normal(256 * 256, np.float32) * np.float32(1e-3)
    loud = pool * np.float32(1e3)  # 1000x: the screening clips it, the mean is refolded

    def made():
        for k in range(1, replies + 1):
            values = loud if poisoned and k == replies else pool
            delta = {n: values.reshape(s) for n, s in SHAPES.items()}  # views: no copy
            yield train_reply(strategy, k, delta, 100 + k, f"s{k}")

    tracemalloc.start()
    arrays, _ = strategy.aggregate_train(1, made())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert arrays is not None
    assert len(strategy.history.rounds[1].clipped) == int(poisoned)
    return peak / BODY_BYTES


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rule", "poisoned", "memory", "bound"),
    [
        ("mean", False, "fast", 2.2),
        ("mean", True, "fast", 2.2),
        ("mean", False, "lean", 1.2),
        ("mean", True, "lean", 1.2),
        ("median", False, "fast", 1.3),
    ],
)
def test_a_round_holds_the_same_whatever_its_number_of_replies(
    tmp_path, monkeypatch, rule: str, poisoned: bool, memory: str, bound: float
) -> None:
    # Prepare: float64 chunks far below a tensor, so what is left is what the round keeps
    monkeypatch.setattr("dept_strategy.aggregate.CHUNK_VALUES", 512)
    monkeypatch.setattr("dept_strategy.screening.CHUNK_VALUES", 512)
    monkeypatch.setattr("dept_strategy.diagnostics.CHUNK_VALUES", 512)
    # Execute
    few, many = (_traced_peak(n, rule, poisoned, memory, tmp_path) for n in (3, 12))
    # Assert: the mean holds its sum and one reply (lean: one at a time), a robust rule one
    # reply or its result
    assert many < few + 0.05, (few, many)
    assert many < bound, many
