"""The strategy under ``embedding-rows=seen``: each φ row averaged over the sources that sent
it, a row nobody sent left where it is, and a reply that names rows wrongly refused."""

import numpy as np
import pytest
import torch
from flwr.app import Array, Message

from dept.wire import keys
from dept_strategy.outer import OuterOptimizer
from dept_strategy.screening import Defences
from dept_strategy.strategy import DeptStrategy
from tests.dept_strategy.mock_replies import (
    BODY,
    assert_rows_averaged_over_senders,
    mock_strategy,
    train_reply,
)

PHI = torch.arange(12, dtype=torch.float32).reshape(6, 2)


def _strategy(trim: bool = False, outer: str = "fedavg", **settings: object) -> DeptStrategy:
    strategy = mock_strategy(
        outer=OuterOptimizer({**BODY, "input": PHI}, kind=outer, lr=1.0, momentum=0.5),
        embedding_names=("input",),
        trim=trim,
        embedding_rows="seen",
        **settings,
    )
    if trim:
        assert strategy.vocabularies is not None
        strategy.vocabularies.ids = {"s1": np.array([0, 1, 2]), "s2": np.array([1, 2, 3, 4])}
    return strategy


def _reply(
    strategy: DeptStrategy,
    node: int,
    rows: list[int],
    value: float,
    weight: float,
    counts: list[int] | None = None,
    **arrays: np.ndarray,
) -> Message:
    """``source s<node>``'s reply: θ and its φ ``rows`` all moved by ``value``."""
    body = {"a": np.full((2, 3), value, np.float32), "b": np.full(4, value, np.float32)}
    phi = np.full((len(rows), 2), value, np.float32)
    reply = train_reply(strategy, node, {**body, "input": phi}, weight, f"s{node}")
    record = reply.content.array_records[keys.ARRAYS]
    record[keys.EMBEDDING_IDS] = Array(np.asarray(rows, np.int32))
    record[keys.EMBEDDING_COUNTS] = Array(np.asarray(counts or [1] * len(rows), np.int32))
    for name, array in arrays.items():
        record[name.replace("_", "-")] = Array(array)
    return reply


def test_each_row_is_the_mean_of_its_senders_and_an_unsent_row_stays() -> None:
    # Prepare: s1 saw rows 0, 1; s2 saw rows 1, 2; nobody saw rows 3-5
    strategy = _strategy()
    replies = [_reply(strategy, 1, [0, 1], 1.0, 1), _reply(strategy, 2, [1, 2], 3.0, 3)]
    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)
    # Assert
    assert_rows_averaged_over_senders(arrays, PHI)


def test_by_occurrences_a_row_weighs_each_sender_by_its_count() -> None:
    strategy = _strategy(embedding_row_weight="occurrences")
    replies = [
        _reply(strategy, 1, [0, 1], 1.0, 10, counts=[5, 9]),
        _reply(strategy, 2, [1, 2], 3.0, 30, counts=[1, 2]),
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    phi = arrays["input"].numpy()
    assert np.allclose(phi[1], PHI[1] - (9 * 1.0 + 1 * 3.0) / 10)
    assert np.allclose(phi[0], PHI[0] - 1.0) and np.allclose(phi[2], PHI[2] - 3.0)
    assert np.allclose(arrays["a"].numpy(), 1.0 - (10 * 1.0 + 30 * 3.0) / 40), "θ by tokens"


def test_trim_under_seen_takes_any_of_its_own_rows_and_no_other() -> None:
    strategy = _strategy(trim=True)
    replies = [
        _reply(strategy, 1, [0, 2], 1.0, 1),  # two of its three
        _reply(strategy, 2, [2, 5], 3.0, 3),  # row 5 is not in its V_k
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    phi = arrays["input"].numpy()
    assert np.allclose(phi[0], PHI[0] - 1.0) and np.allclose(phi[2], PHI[2] - 1.0)
    assert np.array_equal(phi[[1, 3, 4, 5]], PHI[[1, 3, 4, 5]].numpy())
    [rejected] = strategy.history.rounds[1].rejected
    assert rejected["source"] == "s2" and "rows the source was not sent" in rejected["reason"]


@pytest.mark.parametrize(
    ("rows", "counts", "extra", "why"),
    [
        ([1, 0], None, {}, "sorted unique ids"),
        ([0, 6], None, {}, "sorted unique ids in [0, 6)"),
        ([0, 0], None, {}, "sorted unique ids"),
        ([0, 1], [1, 0], {}, "must be >= 1 each"),
        ([0, 1], [300, 1], {}, "at most 200 in all"),
        ([0, 1], None, {"input": np.zeros((3, 2), np.float32)}, "shape (3, 2), expected (2, 2)"),
        ([0, 1], None, {"embedding_counts": np.ones(3, np.int32)}, "one integer per row id"),
        ([0, 1], None, {"embedding_counts": np.ones(2, np.float32)}, "one integer per row id"),
    ],
)
def test_a_reply_that_names_its_rows_wrongly_is_refused_and_named(
    rows: list[int], counts: list[int] | None, extra: dict, why: str
) -> None:
    strategy = _strategy()
    bad = _reply(strategy, 1, rows, 1.0, 100, counts, **extra)
    good = _reply(strategy, 2, [0], 2.0, 100)
    arrays, _ = strategy.aggregate_train(1, [bad, good])
    [rejected] = strategy.history.rounds[1].rejected
    assert rejected["source"] == "s1" and why in rejected["reason"], rejected["reason"]
    assert np.allclose(arrays["input"].numpy()[0], PHI[0] - 2.0), "the round goes on"


def test_a_reply_without_counts_is_refused() -> None:
    strategy = _strategy()
    reply = _reply(strategy, 1, [0, 1], 1.0, 100)
    del reply.content.array_records[keys.ARRAYS][keys.EMBEDDING_COUNTS]
    assert strategy.aggregate_train(1, [reply]) == (None, None)
    assert keys.EMBEDDING_COUNTS in strategy.history.rounds[1].rejected[0]["reason"]


def test_a_row_beyond_local_trainings_reach_is_caught_though_it_is_one_row() -> None:
    strategy = _strategy(defences=Defences(reach=lambda step, biggest: 0.01))
    honest = _reply(strategy, 1, [0, 1], 0.005, 100)
    poisoned = _reply(strategy, 2, [3], 0.005, 100)
    poisoned.content.array_records[keys.ARRAYS]["input"] = Array(np.full((1, 2), 5.0, np.float32))
    arrays, _ = strategy.aggregate_train(1, [honest, poisoned])
    [clipped] = strategy.history.rounds[1].clipped
    assert clipped["source"] == "s2"
    assert "beyond what this round's local training" in clipped["reason"]
    assert np.allclose(arrays["input"].numpy()[3], PHI[3] - 0.01), "scaled within reach"


def test_a_robust_rule_ranks_the_body_and_averages_the_rows_of_their_senders() -> None:
    strategy = _strategy(defences=Defences(aggregation="median"))
    values = (1.0, 1.2, 5.0)  # within the size checks
    replies = [_reply(strategy, n, [n - 1, 3], v, 100) for n, v in enumerate(values, 1)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["a"].numpy(), 1.0 - 1.2), "θ: the median"
    phi = arrays["input"].numpy()
    assert np.allclose(phi[0], PHI[0] - 1.0) and np.allclose(phi[3], PHI[3] - sum(values) / 3)


def test_with_momentum_a_row_nobody_sent_this_round_still_does_not_move() -> None:
    strategy = _strategy(outer="nesterov")
    strategy.aggregate_train(1, [_reply(strategy, 1, [0, 1], 1.0, 100)])
    after_one = strategy.outer.tensors()["input"].clone()
    arrays, _ = strategy.aggregate_train(2, [_reply(strategy, 1, [1], 1.0, 100)])
    phi = arrays["input"].numpy()
    assert np.array_equal(phi[0], after_one[0].numpy()), "its momentum does not carry it"
    assert not np.allclose(phi[1], after_one[1].numpy())


def test_the_interference_of_seen_rows_is_over_the_rows_both_sent() -> None:
    strategy = _strategy()
    replies = [_reply(strategy, 1, [0, 1], 1.0, 100), _reply(strategy, 2, [1, 2], -1.0, 100)]
    strategy.aggregate_train(1, replies)
    cosines = strategy.history.rounds[1].interference["phi"]
    assert cosines[0][1] == pytest.approx(-1.0), "row 1, the one both sent: opposite"
