"""A paper-size body really trains here: two inner steps of ``350m`` on the CPU.

The meta-device tests count every preset; this one allocates the 308M-parameter body, its
gradients and AdamW moments (about 5 GB) and steps it, with activation checkpointing on as a
paper-scale run would have it. Short sequences keep it under a minute on 2 cores.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dept.config import load_config
from dept.model import body_parameters, build_model
from dept.train import make_inner_optimizer, train_local

VOCAB = 512


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
