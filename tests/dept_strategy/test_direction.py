"""The direction check: an update of honest size pointing unlike the round's others is
caught and named, whether honest updates agree (early rounds) or pull apart (late ones)."""

import numpy as np
import pytest

from dept.wire import keys
from dept_strategy.direction import MIN_SPREAD, leave_one_out_cosines, screen_directions
from dept_strategy.screening import Defences
from tests.dept_strategy.mock_replies import BODY, mock_strategy, train_reply

DIM = 20_000


def _updates(n: int, shared: float, seed: int = 0) -> np.ndarray:
    """(n, DIM) honest updates: a common direction (``shared``, negative: each undoes the
    others' mean) plus each one's own, norm about 1."""
    rng = np.random.default_rng(seed)
    own = rng.standard_normal((n, DIM)) / np.sqrt(DIM)
    common = rng.standard_normal(DIM) / np.sqrt(DIM)
    if shared >= 0:
        return own + shared * common
    return own + shared * (own.sum(0) - own) / (n - 1)  # away from the others' mean


def _screen(updates: np.ndarray, factor: float = 3.0) -> tuple[np.ndarray, dict]:
    return screen_directions(updates @ updates.T, np.ones(len(updates)), factor=factor)


def test_leave_one_out_cosines_are_those_of_the_vectors() -> None:
    updates = _updates(5, 0.5)
    weights = np.array([1.0, 2.0, 3.0, 1.0, 0.5])
    found = leave_one_out_cosines(updates @ updates.T, weights)
    for a in range(5):
        others = np.delete(np.arange(5), a)
        mean = weights[others] @ updates[others]
        expected = updates[a] @ mean / np.linalg.norm(updates[a]) / np.linalg.norm(mean)
        assert found[a] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("sources", [3, 4, 8, 16])
@pytest.mark.parametrize("shared", [0.6, -0.6])  # agreeing (early), pulling apart (late)
def test_a_reversed_update_is_the_only_one_flagged(sources: int, shared: float) -> None:
    updates = _updates(sources, shared, seed=sources)
    assert not _screen(updates)[1], "the honest round passes"
    updates[1] *= -1

    cosines, flagged = _screen(updates)

    assert list(flagged) == [1], cosines
    assert 0 < flagged[1].shrink < 1 and "'direction-factor' is 3" in flagged[1].why


def test_two_colluding_reversed_updates_among_eight_are_both_flagged() -> None:
    updates = _updates(8, 0.6)
    updates[[2, 5]] *= -1
    assert sorted(_screen(updates)[1]) == [2, 5]


def test_a_small_reversed_update_is_flagged_like_a_full_one() -> None:
    updates = _updates(8, 0.6)
    updates[3] *= -0.2
    assert list(_screen(updates)[1]) == [3]


def test_nothing_is_flagged_with_two_updates_or_the_check_off() -> None:
    pair = _updates(2, 0.6)
    pair[1] *= -1
    assert not _screen(pair)[1], "with two, each one's cosine is the same number"
    updates = _updates(8, 0.6)
    updates[1] *= -1
    assert not _screen(updates, factor=0)[1]


def test_a_flagged_update_is_scaled_by_the_deviation_allowed_over_its_own() -> None:
    updates = _updates(8, 0.6)
    updates[6] *= -1
    cosines, flagged = _screen(updates)
    median = np.median(cosines)
    spread = max(1.4826 * np.median(np.abs(cosines - median)), MIN_SPREAD)
    assert flagged[6].shrink == pytest.approx(3 * spread / abs(cosines[6] - median))


def _as_reply(update: np.ndarray) -> dict[str, np.ndarray]:
    a = BODY["a"].numel()
    return {
        "a": update[:a].reshape(BODY["a"].shape).astype(np.float32),
        "b": update[a : a + BODY["b"].numel()].astype(np.float32),
    }


@pytest.mark.parametrize("action", ["clip", "reject"])
def test_the_strategy_clips_or_drops_a_reversed_reply_and_names_it(action: str) -> None:
    # Prepare: eight sources whose updates share a direction; one sends its own reversed
    size = BODY["a"].numel() + BODY["b"].numel()
    rng = np.random.default_rng(3)
    common = rng.standard_normal(size)
    updates = [1e-3 * (common + 0.8 * rng.standard_normal(size)) for _ in range(8)]
    updates[4] = -updates[4]
    strategy = mock_strategy(defences=Defences(outlier_action=action))
    replies = [
        train_reply(strategy, n + 1, _as_reply(u), 100, f"s{n}") for n, u in enumerate(updates)
    ]
    # Execute
    arrays, metrics = strategy.aggregate_train(1, replies)
    # Assert
    assert arrays is not None
    record = strategy.history.rounds[1]
    named = record.clipped if action == "clip" else record.rejected
    assert [r["source"] for r in named] == ["s4"] and "direction-factor" in named[0]["reason"]
    loo = record.interference["theta_leave_one_out"]
    assert loo["s4"] < 0 < min(v for s, v in loo.items() if s != "s4")
    assert metrics[keys.NUM_EXAMPLES] == (800 if action == "clip" else 700)
    honest = np.mean([u for n, u in enumerate(updates) if n != 4], axis=0)
    step = np.concatenate([BODY[k].numpy().ravel() - arrays[k].numpy().ravel() for k in "ab"])
    assert np.corrcoef(step, honest)[0, 1] > 0.95
