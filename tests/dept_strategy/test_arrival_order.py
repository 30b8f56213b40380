"""The body after a round does not depend on the order its replies arrived in: the fault
soak found a deployment's body (replies in arrival order) off a fault-free in-process run's
by float32 rounding (2e-8 of its norm), so a resumed run could not match exactly."""

import numpy as np

from tests.dept_strategy.mock_replies import mock_strategy, train_reply

SOURCES = ("a-src", "b-src", "c-src", "d-src")


def _round(order: tuple[int, ...]) -> dict[str, np.ndarray]:
    strategy = mock_strategy()
    rng = np.random.default_rng(0)
    updates = [
        {
            "a": rng.normal(size=(2, 3)).astype(np.float32),
            "b": rng.normal(size=4).astype(np.float32),
        }
        for _ in SOURCES
    ]
    weights = (3.0, 7.0, 11.0, 13.0)
    replies = [train_reply(strategy, i + 1, updates[i], weights[i], SOURCES[i]) for i in order]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    return {k: arrays[k].numpy() for k in ("a", "b")}


def test_the_round_combines_its_replies_in_source_order_whatever_their_arrival() -> None:
    in_order = _round((0, 1, 2, 3))
    for order in ((3, 2, 1, 0), (2, 0, 3, 1), (1, 3, 0, 2)):
        shuffled = _round(order)
        for name, value in in_order.items():
            assert np.array_equal(shuffled[name], value), (order, name)
