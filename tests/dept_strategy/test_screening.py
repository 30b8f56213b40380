"""The screening of a round's updates: reach, the relative check, and sizes that do not
overflow."""

import numpy as np
import pytest

from dept_strategy.screening import UpdateSizes, UpdateStats, median_stats, screen


def _stats(rms: float, biggest: float | None = None) -> UpdateStats:
    return UpdateStats(body_rms=rms, body_max=biggest if biggest is not None else 3 * rms)


def test_sizes_of_an_update_near_the_float32_limit_do_not_overflow() -> None:
    delta = {"w": np.full((4, 4), 3e38, np.float32), "input": np.ones((2, 3), np.float32)}
    tally = UpdateSizes(embedding_names=("input",))
    assert [n for n, _ in tally.observe(delta.items())] == ["w", "input"], "passed on as is"
    stats = tally.stats()
    assert stats.body_rms == pytest.approx(3e38, rel=1e-6) and stats.body_max == pytest.approx(3e38)
    assert stats.embedding_rms == 1.0 and stats.embedding_max == 1.0


@pytest.mark.parametrize("scale", [1e3, 1e6, 3e38])
def test_one_scaled_update_among_four_is_refused_alone(scale: float) -> None:
    honest = [_stats(1.0e-3), _stats(1.2e-3), _stats(0.9e-3)]
    refused = screen([*honest, _stats(1.1e-3 * scale)], reach=0, factor=10, previous=None)
    assert list(refused) == [3]
    assert "the round's median" in refused[3].why and "'update-norm-factor'" in refused[3].why
    assert refused[3].shrink == pytest.approx(1.0e-3 / (1.1e-3 * scale)), "to the median"


def test_one_outlier_of_two_and_a_lone_outlier_are_caught_with_last_rounds_median() -> None:
    previous = _stats(1e-3)
    assert list(screen([_stats(1e-3), _stats(5.0)], reach=0, factor=10, previous=previous)) == [1]
    assert list(screen([_stats(5.0)], reach=0, factor=10, previous=previous)) == [0]
    assert not screen([_stats(2e-3)], reach=0, factor=10, previous=previous)


def test_an_update_beyond_the_reach_of_local_training_is_refused_with_no_reference() -> None:
    refused = screen([_stats(0.01, biggest=2.0)], reach=0.1, factor=0, previous=None)
    assert "beyond what this round's local training can move a weight (0.1)" in refused[0].why
    assert refused[0].shrink == pytest.approx(0.05)
    assert not screen([_stats(0.01, biggest=0.1)], reach=0.1, factor=0, previous=None)


def test_honest_spread_is_kept_and_the_reference_is_the_median() -> None:
    stats = [_stats(r) for r in (1e-3, 3e-3, 6e-3)]
    assert not screen(stats, reach=0, factor=10, previous=None)
    reference = median_stats(stats)
    assert reference is not None and reference.body_rms == 3e-3
    assert median_stats([]) is None


def test_without_the_relative_check_a_reply_beyond_reach_is_scaled_to_the_reach_only() -> None:
    # Two replies and no previous round: no median to scale to (one of the two is itself)
    refused = screen(
        [_stats(0.01, biggest=0.3), _stats(0.002)], reach=0.1, factor=10, previous=None
    )
    assert list(refused) == [0]
    assert refused[0].shrink == pytest.approx(0.1 / 0.3), "to the reach, not to a median"


def test_a_tensor_sized_in_rounds_meets_the_bound_of_its_span() -> None:
    # A fragment that spans 3 rounds may move 3 rounds' worth: sized in rounds it is 1 round
    tally = UpdateSizes(embedding_names=(), units={"frag": 3.0})
    tally.add("frag", np.full(4, 0.3, np.float32))
    tally.add("whole", np.full(4, 0.05, np.float32))
    stats = tally.stats()
    assert stats.body_max == pytest.approx(0.1) and not screen(
        [stats], reach=0.1, factor=0, previous=None
    )


def test_two_replies_without_a_previous_round_cannot_accuse_each_other() -> None:
    # A tiny update would make the honest one "100x the median" of two.
    assert not screen([_stats(1e-3), _stats(1e-5)], reach=0, factor=10, previous=None)
    assert not screen([_stats(1e-3), _stats(1e-5)], reach=0, factor=10, previous=_stats(1e-3))


def test_a_signs_only_update_is_caught_by_its_flatness_and_brought_to_the_median_rms() -> None:
    # Prepare: AdamW-like updates (RMS about a fifth of the max) and one of signs only at
    # the same max: 4x the median RMS, so within the relative check's 10x
    honest = [_stats(0.013, 0.052), _stats(0.012, 0.057), _stats(0.013, 0.048)]
    signs = _stats(0.052, 0.052)
    # Execute
    flagged = screen([*honest, signs], reach=0, factor=10, previous=None, flatness=2.5)
    # Assert
    assert list(flagged) == [3] and "'flatness-factor' is 2.5" in flagged[3].why
    assert flagged[3].shrink == pytest.approx(0.013 / 0.052), "to the round's median RMS"
    assert not screen([*honest, signs], reach=0, factor=10, previous=None, flatness=0)


def test_a_flat_update_no_larger_than_the_rounds_is_let_be() -> None:
    # one source took a single Adam step (every value about lr): flat, but small
    honest = [_stats(0.013, 0.052), _stats(0.012, 0.057), _stats(0.013, 0.048)]
    assert not screen(
        [*honest, _stats(0.004, 0.0045)], reach=0, factor=10, previous=None, flatness=2.5
    )
    assert not screen(
        [_stats(0.013, 0.052), _stats(0.052, 0.052)],
        reach=0,
        factor=10,
        previous=None,
        flatness=2.5,
    ), "two replies and no previous round: no reference"
