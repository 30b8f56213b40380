"""The inner-optimizer option: plain SGD takes the step its doc promises, and the server's
bound on a round's update (max_round_update) holds for it, tightly, as it does for AdamW."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dept.config import ConfigError, DeptConfig, load_config
from dept.model.build import build_model
from dept.train.local import lr_at, make_inner_optimizer, max_round_update


@pytest.fixture
def sgd_config(debug_config: DeptConfig) -> DeptConfig:
    return dataclasses.replace(debug_config, inner_optimizer="sgd", weight_decay=0.1)


def test_sgd_steps_w_minus_lr_times_clipped_gradient_plus_decay_on_matrices(
    sgd_config: DeptConfig,
) -> None:
    # Prepare
    model = build_model("debug", 64, sgd_config.seq_len)
    optimizer = make_inner_optimizer(model, sgd_config)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator)
    # Execute
    torch.nn.utils.clip_grad_norm_(model.parameters(), sgd_config.grad_clip)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    # Assert
    assert isinstance(optimizer, torch.optim.SGD)
    lr, decay = sgd_config.lr, sgd_config.weight_decay
    for name, param in model.named_parameters():
        w = before[name]
        wanted = w - lr * (grads[name] + (decay * w if w.dim() >= 2 else 0.0))
        torch.testing.assert_close(param.detach(), wanted, rtol=1e-6, atol=1e-8, msg=name)
    assert optimizer.state_dict()["state"] == {}, "no momentum: nothing to keep across rounds"


def test_adamw_stays_the_default(debug_config: DeptConfig) -> None:
    model = build_model("debug", 64, debug_config.seq_len)

    assert debug_config.inner_optimizer == "adamw"
    assert isinstance(make_inner_optimizer(model, debug_config), torch.optim.AdamW)


def test_an_unknown_inner_optimizer_names_the_key() -> None:
    with pytest.raises(ConfigError, match="inner-optimizer"):
        load_config({"inner-optimizer": "lion"})


@pytest.mark.parametrize("decay", [0.0, 0.1])
def test_no_round_of_sgd_moves_a_weight_beyond_max_round_update_which_it_reaches(
    sgd_config: DeptConfig, decay: float
) -> None:
    # Prepare: one coordinate gets the whole clipped gradient every step, the worst case
    cfg = dataclasses.replace(sgd_config, weight_decay=decay)
    start = torch.zeros(8, 8, dtype=torch.float64)  # float32 steps on -2.0 round by ~1e-5
    start[0, 0] = -2.0
    weight = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.SGD([weight], lr=cfg.lr, weight_decay=decay)
    # Execute
    for step in range(cfg.local_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        weight.grad = torch.zeros_like(start)
        weight.grad[0, 0] = 1e3
        torch.nn.utils.clip_grad_norm_([weight], cfg.grad_clip)
        optimizer.step()
    # Assert
    moved = float((weight.detach() - start).abs().max())
    bound = max_round_update(cfg, 0, float(start.abs().max()))
    assert 0 < moved <= bound
    if decay == 0:
        assert math.isclose(moved, bound, rel_tol=1e-5), "the bound is tight without decay"


def test_sgd_without_clipping_has_no_bound(sgd_config: DeptConfig) -> None:
    unclipped = dataclasses.replace(sgd_config, grad_clip=0.0)

    assert max_round_update(unclipped, 0, 1.0) == math.inf
    assert math.isfinite(max_round_update(sgd_config, 0, 1.0))
