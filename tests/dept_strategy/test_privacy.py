"""Central DP: each source clipped to dp-clip-norm, one weight each, noise of σ·C on the
sum over the sampled sources, ε as the accountant gives it; refused where it cannot hold."""

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import PLDAccountant

from dept.config import ConfigError, load_config
from dept_strategy.outer import OuterOptimizer
from dept_strategy.privacy import CentralPrivacy
from dept_strategy.screening import Defences
from tests.dept_strategy.mock_replies import instruction_to, mock_strategy, train_reply

SHAPE = (200, 100)  # 20,000 coordinates: the noise's spread measured to about 1%


def _strategy(privacy: CentralPrivacy, **kwargs):
    outer = OuterOptimizer({"w": torch.zeros(SHAPE)}, kind="fedavg")
    return mock_strategy(outer=outer, privacy=privacy, **kwargs)


def _update(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(SHAPE, value, np.float32)}


def _step(strategy, updates: dict[str, tuple[float, float]]) -> np.ndarray:
    """The outer step (fedavg, lr 1: the combined update) from ``{source: (value, tokens)}``."""
    replies = [
        train_reply(strategy, n + 1, _update(value), tokens, source)
        for n, (source, (value, tokens)) in enumerate(updates.items())
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    return -arrays["w"].numpy()


@pytest.mark.parametrize(("sigma", "rounds"), [(0.5, 1), (1.0, 10), (4.0, 100)])
def test_epsilon_is_the_rdp_accountants_and_between_the_exact_and_the_classic_bound(
    sigma: float, rounds: int
) -> None:
    privacy = CentralPrivacy(noise_multiplier=sigma, delta=1e-5)
    found = privacy.epsilon(rounds)
    # the library's own RDP accountant, its default orders
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma), rounds)
    assert found == pytest.approx(accountant.get_epsilon(1e-5), rel=0.02)
    # never below the privacy-loss-distribution accountant's (near exact) figure...
    pld = PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(sigma), rounds)
    assert found >= pld.get_epsilon(1e-5) * 0.999
    # ...and never above the classic conversion of the Gaussian's RDP, T·α/(2σ²)
    classic = min(
        rounds * a / (2 * sigma**2) + math.log(1 / 1e-5) / (a - 1)
        for a in np.linspace(1.01, 500, 50_000)
    )
    assert found <= classic
    assert privacy.epsilon(0) == 0.0


def test_the_noise_is_sigma_times_the_clip_over_the_sources_sampled() -> None:
    strategy = _strategy(CentralPrivacy(noise_multiplier=2.0, clip_norm=3.0))
    step = _step(strategy, {s: (0.0, 100) for s in ("a", "b", "c", "d")})
    assert step.mean() == pytest.approx(0.0, abs=0.03)
    assert step.std() == pytest.approx(2.0 * 3.0 / 4, rel=0.02)


def test_each_source_counts_once_clipped_and_a_missing_one_still_divides() -> None:
    # Prepare: noise negligible; "big" sends norm 1e3, "small" norm 0.1, a third was sampled
    # but never answered; the clip is 1.0, tokens differ tenfold
    strategy = _strategy(CentralPrivacy(noise_multiplier=1e-9, clip_norm=1.0))
    instruction_to(strategy, 9, "absent")
    norm_one = 1.0 / math.sqrt(math.prod(SHAPE))  # a value whose update has norm 1
    # Execute
    step = _step(strategy, {"big": (1e3 * norm_one, 1000), "small": (0.1 * norm_one, 100)})
    # Assert: (clip(big) + small) / 3 sampled, token counts ignored
    assert step.mean() == pytest.approx((1.0 + 0.1) * norm_one / 3, rel=1e-4)
    record = strategy.history.rounds[1]
    assert record.privacy["sampled"] == 3 and record.privacy["clipped"] == 1
    assert record.privacy["released_rounds"] == 1
    assert record.privacy["epsilon"] == CentralPrivacy(1e-9).epsilon(1)


def test_epsilon_grows_with_each_released_round_and_is_in_the_round_line() -> None:
    privacy = CentralPrivacy(noise_multiplier=1.0)
    strategy = _strategy(privacy)
    for server_round in (1, 2):
        replies = [train_reply(strategy, 1, _update(0.001), 10, "a")]
        assert strategy.aggregate_train(server_round, replies)[0] is not None
    line = strategy.history.round_json(2)
    assert line["privacy"]["released_rounds"] == 2
    assert line["privacy"]["epsilon"] == pytest.approx(privacy.epsilon(2))
    assert strategy.history.privacy() == line["privacy"]


def test_without_dp_a_round_line_has_no_privacy_entry() -> None:
    strategy = mock_strategy()
    replies = [
        train_reply(
            strategy, 1, {"a": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32)}, 10, "a"
        )
    ]
    assert strategy.aggregate_train(1, replies)[0] is not None
    assert "privacy" not in strategy.history.round_json(1) and strategy.history.privacy() == {}


@pytest.mark.parametrize(
    ("override", "settings", "named"),
    [
        ({"aggregation": "trimmed-mean"}, {"defences": Defences("trimmed-mean")}, "'mean'"),
        ({"variant": "trim"}, {"trim": True}, "use glob with embedding-rows='all'"),
        (
            {"variant": "glob", "embedding-rows": "seen"},
            {"embedding_rows": "seen"},
            "use glob with embedding-rows='all'",
        ),
        ({"fragments": 2}, {"fragments": 2}, "fragments=1"),
    ],
)
def test_dp_is_refused_where_it_cannot_hold(override: dict, settings: dict, named: str) -> None:
    with pytest.raises(ConfigError, match="dp-noise-multiplier") as caught:
        load_config({"dp-noise-multiplier": 1.0, **override})
    assert named in str(caught.value)
    load_config({"dp-noise-multiplier": 0.0, **override})  # off: nothing to refuse
    with pytest.raises(ValueError, match=f"central differential privacy: .*{named}"):
        _strategy(CentralPrivacy(1.0), **settings)


# Issue 49's counter-example: with A among them, the direction check drops B; without A, B
# passes. A check against the others lets one source decide whether another's counts.
HONEST = [[0.779, -0.049], [0.855, 0.18], [1.012, -0.088], [0.765, -0.077]]
B, A = [0.008, -0.276], [2.588, 2.013]


def _released_sum(updates: dict[str, list[float]], privacy: CentralPrivacy) -> np.ndarray:
    """Σ of the clipped updates of one round before its noise (the round's mean times the
    sources sampled), under the default screening."""
    outer = OuterOptimizer({"w": torch.zeros(len(next(iter(updates.values()))))}, kind="fedavg")
    strategy = mock_strategy(outer=outer, privacy=privacy, defences=Defences())
    replies = [
        train_reply(strategy, n + 1, {"w": np.asarray(u, np.float32)}, 100, source)
        for n, (source, u) in enumerate(updates.items())
    ]
    captured: list[np.ndarray] = []
    noise = CentralPrivacy.add_noise

    def before_noise(self: CentralPrivacy, mean: dict, sampled: int) -> None:
        captured.append(mean["w"].numpy() * sampled)
        noise(self, mean, sampled)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CentralPrivacy, "add_noise", before_noise)
        strategy.aggregate_train(1, replies)
    return captured[0] if captured else np.zeros(2)


def test_the_counter_example_without_dp_and_its_bound_with_dp() -> None:
    honest = {f"h{i}": u for i, u in enumerate(HONEST)}
    # without DP the direction check flags B beside A, and not alone
    off = CentralPrivacy()
    strategy = mock_strategy(outer=OuterOptimizer({"w": torch.zeros(2)}, kind="fedavg"))
    replies = [
        train_reply(strategy, n + 1, {"w": np.asarray(u, np.float32)}, 100, s)
        for n, (s, u) in enumerate({**honest, "B": B, "A": A}.items())
    ]
    strategy.aggregate_train(1, replies)
    assert "B" in {c["source"] for c in strategy.history.rounds[1].clipped}, "the premise"
    assert off.on is False
    # with DP each is screened on its own: A's presence moves the sum by A's clipped self
    privacy = CentralPrivacy(noise_multiplier=1.0, clip_norm=1.0)
    with_a = _released_sum({**honest, "B": B, "A": A}, privacy)
    without_a = _released_sum({**honest, "B": B}, privacy)
    assert np.linalg.norm(with_a - without_a) <= privacy.clip_norm * (1 + 1e-6)
    clipped_a = np.asarray(A) / np.linalg.norm(A)
    assert np.allclose(with_a - without_a, clipped_a, atol=1e-5)


def test_removing_any_one_source_moves_the_sum_by_at_most_the_clip() -> None:
    rng = np.random.default_rng(49)
    privacy = CentralPrivacy(noise_multiplier=1.0, clip_norm=0.5)
    for _ in range(60):
        count, dim = int(rng.integers(3, 8)), int(rng.integers(2, 6))
        updates = rng.normal(size=(count, dim)) * rng.choice([0.1, 1.0, 10.0], size=(count, 1))
        if rng.random() < 0.5:  # one pointing against the others, as a poisoner would
            updates[0] = -updates[1:].sum(axis=0) * rng.uniform(1, 5)
        named = {f"s{i}": list(u) for i, u in enumerate(updates)}
        whole = _released_sum(named, privacy)
        for left_out in named:
            rest = _released_sum({k: v for k, v in named.items() if k != left_out}, privacy)
            moved = float(np.linalg.norm(whole - rest))
            assert moved <= privacy.clip_norm * (1 + 1e-5), (named, left_out, moved)


def test_under_dp_the_checks_against_the_others_are_off_and_said(project_log) -> None:
    strategy = _strategy(CentralPrivacy(noise_multiplier=1.0), num_server_rounds=2)
    defences = strategy.settings.defences
    assert (defences.update_norm_factor, defences.flatness_factor, defences.direction_factor) == (
        0.0,
        0.0,
        0.0,
    )
    assert strategy.settings.off_for_privacy == ("update-norm-factor", "direction-factor")
    strategy.summary()
    assert "update-norm-factor, direction-factor off" in project_log.text
