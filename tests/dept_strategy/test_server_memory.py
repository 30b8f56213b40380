"""server-memory=lean folds the round's mean from the spool once the last reply is in: the
body comes out bit for bit as with the running mean folded while replies arrive, whatever
their order, with a reply clipped, and with central DP's weights."""

import numpy as np
import pytest
import torch

from dept.config import ConfigError, load_config
from dept_strategy.outer import OuterOptimizer
from dept_strategy.privacy import CentralPrivacy
from dept_strategy.settings import StrategySettings
from tests.dept_strategy.mock_replies import mock_strategy, train_reply

SHAPES = {"w": (30, 20), "v": (7,)}
ARRIVALS = ["s3", "s1", "s4", "s2"]  # not the sources' order, in which the mean is folded


def _body(memory: str, loud: str | None = None, **settings) -> dict[str, torch.Tensor]:
    outer = OuterOptimizer({n: torch.zeros(s) for n, s in SHAPES.items()}, kind="nesterov")
    strategy = mock_strategy(outer=outer, server_memory=memory, **settings)
    rng = np.random.default_rng(7)
    replies = []
    for node, source in enumerate(ARRIVALS, start=1):
        scale = np.float32(1e4 if source == loud else 1e-3)
        delta = {n: rng.standard_normal(s).astype(np.float32) * scale for n, s in SHAPES.items()}
        replies.append(train_reply(strategy, node, delta, 100 + 37 * node, source))
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    if loud:
        assert strategy.history.rounds[1].clipped, "the loud reply was clipped"
    return {n: torch.from_numpy(a.numpy().copy()) for n, a in arrays.items()}


@pytest.mark.parametrize(
    "settings",
    [{}, {"loud": "s4"}, {"privacy": CentralPrivacy(noise_multiplier=1.0, clip_norm=0.01)}],
    ids=["plain", "a-reply-clipped", "central-dp"],
)
def test_lean_gives_the_body_the_running_mean_gives(
    settings: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dept_strategy.privacy.secrets.randbits", lambda bits: 12345)  # DP's noise
    fast, lean = _body("fast", **settings), _body("lean", **settings)

    assert fast.keys() == lean.keys()
    assert all(torch.equal(fast[n], lean[n]) for n in fast), "bit for bit"
    assert any(bool(t.abs().sum() > 0) for t in lean.values()), "the round moved the body"


def test_an_unknown_server_memory_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="server-memory"):
        load_config({"server-memory": "tiny"})
    with pytest.raises(ValueError, match="server_memory"):
        StrategySettings("r", 5, server_memory="tiny")
