"""The paper's regime: its sizes at seq-len 2048, its batch reached by accumulation, and a
paper-size body that really trains.

``configs/paper-1.3b.toml`` is the authors' 1.3B setting as run config overrides; the
pre-flight (:mod:`dept.train.budget`) must refuse it on a small CPU machine, before any work, and
let it through on a large GPU. The slow test allocates a 350m body (308M parameters, about
5 GB with its gradients and AdamW moments) and steps it twice on the CPU.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.common.config import parse_config_args

from dept.config import ConfigError, DeptConfig, load_config, to_run_config
from dept.model.build import build_model
from dept.model.roles import body_parameters
from dept.train.budget import PEAK_FLOPS, PEAK_FLOPS_PER_CPU_THREAD, Device, check_client_fits
from dept.train.local import make_inner_optimizer, next_token_loss, train_local

PAPER_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "paper-1.3b.toml"
VOCAB = 512
NEOX_VOCAB = 50_368
SMALL_CPU = Device("cpu", memory=25e9, peak_flops=2 * PEAK_FLOPS_PER_CPU_THREAD)  # this CI box
H200 = Device("cuda", memory=139e9, peak_flops=PEAK_FLOPS["cuda"])


def paper_config() -> DeptConfig:
    """The example file read as ``dept run -c FILE`` reads it."""
    return load_config(
        to_run_config(DeptConfig()), overrides=parse_config_args([str(PAPER_CONFIG)])
    )


def test_the_paper_config_reaches_its_batch_by_accumulation() -> None:
    cfg = paper_config()

    assert (cfg.model, cfg.seq_len, cfg.local_steps) == ("1.3b", 2048, 500)
    assert cfg.batch_size * cfg.grad_accum_steps == 512, "sequences per inner step"
    assert cfg.activation_checkpointing and not cfg.keep_inner_optimizer


def test_the_preflight_refuses_the_paper_config_on_a_small_cpu_and_not_on_a_gpu() -> None:
    cfg = paper_config()

    with pytest.raises(ConfigError, match=r"config key 'model' \(1.3b\): a client needs at least"):
        check_client_fits(cfg, NEOX_VOCAB, "config key 'global-vocab-size'", SMALL_CPU)
    with pytest.raises(ConfigError, match=r"config key 'grad-accum-steps' \(64\): a round trains"):
        check_client_fits(cfg, 300, "source 'a' key 'vocab-size'", SMALL_CPU)
    check_client_fits(cfg, NEOX_VOCAB, "config key 'global-vocab-size'", H200)


@pytest.mark.parametrize("model", ["debug", "gpt2:debug"])
def test_every_family_trains_at_seq_len_2048(model: str) -> None:
    built = build_model(model, VOCAB, 2048, activation_checkpointing=True)
    built.train()
    batch = torch.randint(0, VOCAB, (1, 2049), generator=torch.Generator().manual_seed(0))

    next_token_loss(built, batch).backward()

    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in built.parameters())


@pytest.mark.slow
def test_two_inner_steps_of_350m_on_the_cpu() -> None:
    cfg = load_config(
        {
            "model": "350m",
            "seq-len": 64,
            "batch-size": 2,
            "local-steps": 2,
            "warmup-steps": 0,
            "activation-checkpointing": True,
            "device": "cpu",
        }
    )
    model = build_model(
        cfg.model, VOCAB, cfg.seq_len, activation_checkpointing=cfg.activation_checkpointing
    )
    optimizer = make_inner_optimizer(model, cfg)
    layer = "model.layers.23.mlp.down_proj.weight"
    before = body_parameters(model)[layer].detach().clone()
    batch = np.random.default_rng(0).integers(0, VOCAB, (cfg.batch_size, cfg.seq_len + 1))

    stats = train_local(model, optimizer, itertools.repeat(batch), cfg, start_step=0, desc="350m")

    assert stats.steps == 2 and stats.tokens == 2 * cfg.batch_size * cfg.seq_len
    first_loss = 2 * stats.mean_loss - stats.final_loss
    assert first_loss == pytest.approx(np.log(VOCAB), abs=0.5), "a fresh model guesses uniformly"
    assert stats.final_loss < first_loss, "one step on the same batch lowered its loss"
    assert not torch.equal(body_parameters(model)[layer], before), "the last layer moved"
