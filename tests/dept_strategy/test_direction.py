"""The direction check: an update of honest size pointing against the round's others is
caught and named, by its per-tensor agreement; a source merely unlike the others is not."""

import numpy as np
import pytest

from dept.wire import keys
from dept_strategy.direction import (
    MIN_SPREAD,
    agreements,
    leave_one_out_cosines,
    screen_directions,
)
from dept_strategy.screening import Defences
from dept_strategy.training_round import smoothed_agreement
from tests.dept_strategy.mock_replies import BODY, mock_strategy, train_reply

SIZES = [4_000] * 6 + [64] * 4  # six noisy matrices, four small tensors moved alike (norms)


def _updates(n: int, shared: float | np.ndarray, seed: int = 0) -> list[np.ndarray]:
    """Per tensor, (n, size) honest updates: each source's own noise, plus on the small
    tensors a direction common to all, ``shared`` of it (one figure, or one per source)."""
    rng = np.random.default_rng(seed)
    share = np.broadcast_to(np.asarray(shared, float), (n,)).reshape(n, 1)
    tensors = []
    for size in SIZES:  # every value of a similar size, as AdamW's steps are
        own = rng.standard_normal((n, size))
        common = rng.standard_normal(size)
        tensors.append(own + (share * common if size < 100 else 0.0))
    return tensors


def _dots(tensors: list[np.ndarray]) -> list[np.ndarray]:
    return [t @ t.T for t in tensors]


def _screen(tensors: list[np.ndarray], factor: float = 4.0) -> tuple[np.ndarray, dict]:
    n = len(tensors[0])
    return screen_directions(_dots(tensors), np.ones(n), factor=factor)


def _flip(tensors: list[np.ndarray], rows: list[int], by: float = -1.0) -> None:
    for t in tensors:
        t[rows] *= by


def test_leave_one_out_cosines_are_those_of_the_vectors() -> None:
    updates = _updates(5, 1.0)[-1]
    weights = np.array([1.0, 2.0, 3.0, 1.0, 0.5])
    found = leave_one_out_cosines(updates @ updates.T, weights)
    for a in range(5):
        others = np.delete(np.arange(5), a)
        mean = weights[others] @ updates[others]
        expected = updates[a] @ mean / np.linalg.norm(updates[a]) / np.linalg.norm(mean)
        assert found[a] == pytest.approx(expected, rel=1e-9)


def test_agreement_weighs_every_tensor_alike() -> None:
    tensors = _updates(4, 1.0)
    per_tensor = [leave_one_out_cosines(d, np.ones(4)) for d in _dots(tensors)]
    assert agreements(_dots(tensors), np.ones(4)) == pytest.approx(np.mean(per_tensor, axis=0))
    whole = np.concatenate(tensors, axis=1)
    assert abs(leave_one_out_cosines(whole @ whole.T, np.ones(4))).max() < 0.1, (
        "over the whole body the noisy matrices hide the agreement"
    )
    assert agreements(_dots(tensors), np.ones(4)).min() > 0.2


@pytest.mark.parametrize("sources", [3, 4, 8, 16])
def test_a_reversed_update_is_the_only_one_flagged(sources: int) -> None:
    tensors = _updates(sources, 1.0, seed=sources)
    assert not _screen(tensors)[1], "the honest round passes"
    _flip(tensors, [1])

    found, flagged = _screen(tensors)

    assert list(flagged) == [1], found
    assert 0 <= flagged[1].shrink < 1 and "'direction-factor' is 4" in flagged[1].why


def test_two_colluding_reversed_updates_among_eight_are_both_flagged() -> None:
    tensors = _updates(8, 1.0)
    _flip(tensors, [2, 5])
    assert sorted(_screen(tensors)[1]) == [2, 5]


def test_a_small_reversed_update_is_flagged_like_a_full_one() -> None:
    tensors = _updates(8, 1.0)
    _flip(tensors, [3], by=-0.2)
    assert list(_screen(tensors)[1]) == [3]


def test_a_source_that_agrees_less_but_not_against_the_others_passes() -> None:
    # one source (code among languages) shares a fifth as much of the common direction
    found, flagged = _screen(_updates(8, [1.0, 1.0, 1.0, 1.0, 0.2, 1.0, 1.0, 1.0]))
    assert 0 < found[4] < np.median(found) / 2 and not flagged


def test_a_round_pulling_apart_flags_nothing() -> None:
    tensors = _updates(8, 0.0)
    for t in tensors:  # each one partly undoes the others' mean
        t -= 0.3 * (t.sum(0) - t) / 7
    found, flagged = _screen(tensors)
    assert np.median(found) < 0 and not flagged


def test_nothing_is_flagged_with_two_updates_or_the_check_off() -> None:
    pair = _updates(2, 1.0)
    _flip(pair, [1])
    assert not _screen(pair)[1], "with two, each one's cosine is the same number"
    tensors = _updates(8, 1.0)
    _flip(tensors, [1])
    assert not _screen(tensors, factor=0)[1]


@pytest.mark.parametrize("by", [-1.0, -0.05])
def test_a_flagged_update_keeps_less_of_its_weight_the_further_below_it_is(by: float) -> None:
    tensors = _updates(8, 1.0)
    _flip(tensors, [6], by=by)
    found, flagged = _screen(tensors, factor=2.0)
    median = np.median(found)
    spread = max(1.4826 * np.median(np.abs(found - median)), MIN_SPREAD)
    beyond = (median - found[6]) / (2.0 * spread)  # in thresholds
    assert beyond > 1 and flagged[6].shrink == pytest.approx(max(0.0, 2.0 - beyond))


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
    agreement = record.agreement
    assert agreement["s4"] < 0 < min(v for s, v in agreement.items() if s != "s4")
    assert metrics[keys.NUM_EXAMPLES] == (800 if action == "clip" else 700)
    honest = np.mean([u for n, u in enumerate(updates) if n != 4], axis=0)
    step = np.concatenate([BODY[k].numpy().ravel() - arrays[k].numpy().ravel() for k in "ab"])
    assert np.corrcoef(step, honest)[0, 1] > 0.95


def test_one_round_against_the_others_is_forgiven_where_the_source_agreed_before() -> None:
    # Prepare: a round where source 4 honestly pulls against the rest for once
    tensors = _updates(8, 1.0)
    _flip(tensors, [4], by=-0.5)
    alone = _screen(tensors)[1]
    before = np.full(8, 0.3)  # every source agreed in its earlier rounds
    # Execute
    found, flagged = screen_directions(_dots(tensors), np.ones(8), factor=4.0, before=before)
    # Assert
    assert list(alone) == [4], "judged on this round alone it is flagged"
    assert found[4] < 0 and not flagged


def test_a_source_against_the_others_round_after_round_is_flagged() -> None:
    tensors = _updates(8, 1.0)
    _flip(tensors, [4], by=-0.5)
    before = np.array([0.3, 0.3, 0.3, 0.3, -0.3, 0.3, 0.3, np.nan])  # 7 joins this round
    _, flagged = screen_directions(_dots(tensors), np.ones(8), factor=4.0, before=before)
    assert list(flagged) == [4] and "smoothed over its rounds" in flagged[4].why


def test_the_strategy_smooths_a_sources_agreement_over_its_rounds() -> None:
    strategy = mock_strategy()
    strategy.history.at(1).agreement = {"s": -0.2, "t": 0.1}
    strategy.history.at(2).agreement = {"s": 0.4}
    history = strategy.history
    assert smoothed_agreement(history, "s", 3) == pytest.approx(0.1)
    assert smoothed_agreement(history, "s", 2) == pytest.approx(-0.2), "earlier rounds only"
    assert np.isnan(smoothed_agreement(history, "new", 3))
