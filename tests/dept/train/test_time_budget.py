"""Time budgets (round-time-s): how many steps a round takes, on which schedule steps, and
the config that turns them on (dept.train.local.StepBudget, dept.config)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from dept.config import ConfigError, DeptConfig, load_config
from dept.data.token_stream import StreamPosition, training_batches
from dept.model.build import build_model
from dept.train.local import StepBudget, TrainStats, lr_at, make_inner_optimizer, train_local
from tests.helpers import debug_run_config

VOCAB = 64


def _never(flag: bool) -> bool:
    raise AssertionError("a fixed round asked the ranks to agree")


def test_a_fixed_budget_counts_steps_and_never_asks_the_ranks() -> None:
    fixed = StepBudget(3)

    assert [fixed.go_on(done, 1e9, 1e9, _never) for done in (1, 2, 3)] == [True, True, False]


@pytest.mark.parametrize(
    ("done", "elapsed", "last", "more"),
    [
        (1, 0.5, 0.4, True),  # another 0.4 s step ends at 0.9 s: within the budget
        (2, 0.9, 0.4, False),  # it would end at 1.3 s
        (5, 0.1, 0.01, False),  # the cap, however much time is left
    ],
)
def test_a_timed_budget_stops_before_a_step_would_pass_it(
    done: int, elapsed: float, last: float, more: bool
) -> None:
    assert StepBudget(5, 1.0).go_on(done, elapsed, last, bool) is more


def test_rank_zeros_decision_wins_in_a_timed_round() -> None:
    asked: list[bool] = []

    def rank_zero_stops(flag: bool) -> bool:
        asked.append(flag)
        return False

    assert StepBudget(5, 10.0).go_on(1, 0.0, 0.0, rank_zero_stops) is False
    assert asked == [True], "this rank wanted another step; rank 0's answer stands"


def test_the_budget_comes_from_the_config(debug_config: DeptConfig) -> None:
    timed = dataclasses.replace(debug_config, round_time_s=2.5, max_local_steps=20)

    assert StepBudget.of(debug_config) == StepBudget(debug_config.local_steps)
    assert StepBudget.of(timed) == StepBudget(20, 2.5)
    assert StepBudget.of(dataclasses.replace(timed, max_local_steps=0)).steps == timed.local_steps
    assert StepBudget.of(dataclasses.replace(debug_config, step_delay_s=0.1)).delay_s == 0.1


def _batches(seq_len: int) -> Iterator[np.ndarray]:
    tokens = np.tile(np.random.default_rng(0).integers(0, VOCAB, size=50), 200).astype(np.int32)
    return training_batches(tokens, seq_len, 4, 0, StreamPosition())


def _train(
    cfg: DeptConfig, budget: StepBudget | None, start_step: int = 0
) -> tuple[TrainStats, torch.nn.Module, list[tuple[int, float, float]], int]:
    """(stats, model, per step: (global steps done, its lr, when it ended), batches drawn);
    the steps start with the moment before training."""
    model = build_model("debug", VOCAB, cfg.seq_len, seed=0)
    optimizer = make_inner_optimizer(model, cfg)
    drawn = 0
    stream = _batches(cfg.seq_len)

    def counted() -> Iterator[np.ndarray]:
        nonlocal drawn
        for batch in stream:
            drawn += 1
            yield batch

    steps: list[tuple[int, float, float]] = [(start_step, math.nan, time.perf_counter())]

    def note(done: int) -> None:
        steps.append((done, optimizer.param_groups[0]["lr"], time.perf_counter()))

    stats = train_local(
        model,
        optimizer,
        counted(),
        cfg,
        start_step=start_step,
        desc="t",
        after_step=note,
        budget=budget,
    )
    return stats, model, steps, drawn


def test_budget_off_trains_exactly_as_before(debug_config: DeptConfig) -> None:
    """No round-time-s: local-steps steps and the same weights, bit for bit, as training
    without a budget (the baselines' path), whatever max-local-steps says."""
    capped = dataclasses.replace(debug_config, max_local_steps=3 * debug_config.local_steps)
    before, model_before, _, _ = _train(debug_config, None)
    after, model_after, _, _ = _train(capped, StepBudget.of(capped))

    assert after.steps == before.steps == debug_config.local_steps
    assert after.tokens == before.tokens and after.mean_loss == before.mean_loss
    for (name, a), b in zip(
        model_after.state_dict().items(), model_before.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_a_slowed_source_trains_fewer_steps_and_both_end_within_budget_and_a_step(
    debug_config: DeptConfig,
) -> None:
    cfg = dataclasses.replace(debug_config, seq_len=16)  # short steps: many fit in the budget
    seconds, delay = 1.0, 0.15
    fast = StepBudget(50, seconds)
    slow = dataclasses.replace(fast, delay_s=delay)
    rounds = {"fast": _train(cfg, fast), "slow": _train(cfg, slow)}

    for name, (stats, _, steps, drawn) in rounds.items():
        ends = [when for _, _, when in steps]
        longest = max(b - a for a, b in itertools.pairwise(ends))
        assert 1 <= stats.steps <= 50
        assert stats.seconds <= seconds + longest + 0.05, (name, stats.seconds, longest)
        assert drawn == stats.steps * cfg.grad_accum_steps, "no batch drawn in vain"
        assert stats.tokens == stats.steps * 4 * cfg.seq_len
    assert rounds["slow"][0].steps <= seconds / delay
    assert rounds["slow"][0].steps < rounds["fast"][0].steps, {
        k: v[0].steps for k, v in rounds.items()
    }


def test_a_budget_shorter_than_a_step_still_trains_one(debug_config: DeptConfig) -> None:
    stats, _, _, _ = _train(debug_config, StepBudget(10, 1e-6))

    assert stats.steps == 1 and stats.tokens == 4 * debug_config.seq_len


def test_the_schedule_position_after_a_round_is_its_start_plus_the_steps_trained(
    debug_config: DeptConfig,
) -> None:
    cfg = dataclasses.replace(debug_config, num_server_rounds=4)
    start = cfg.local_steps  # round 2
    stats, _, steps, _ = _train(cfg, StepBudget(40, 0.3, 0.05), start_step=start)

    assert steps[-1][0] == start + stats.steps
    assert [lr for _, lr, _ in steps[1:]] == [lr_at(start + i, cfg) for i in range(stats.steps)]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"round-time-s": -1.0}, "'round-time-s' must be >= 0"),
        ({"step-delay-s": -0.5}, "'step-delay-s' must be >= 0"),
        ({"round-time-s": 5.0, "max-local-steps": -1}, "'max-local-steps' .* must be 0"),
        ({"round-time-s": 5.0, "max-local-steps": 3}, r"'max-local-steps' \(3\) must be 0"),
    ],
)
def test_bad_budget_values_name_their_key(tmp_path, overrides: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(debug_run_config(tmp_path, **overrides))


def test_the_cap_bounds_what_the_server_accepts(tmp_path) -> None:
    cfg = load_config(debug_run_config(tmp_path, **{"max-local-steps": 20}))

    assert cfg.step_cap == 20 and load_config(debug_run_config(tmp_path)).step_cap == 8
