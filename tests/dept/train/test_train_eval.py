import math

import numpy as np
import pytest
import torch

from dept.config import DeptConfig
from dept.data.token_stream import StreamPosition, training_batches
from dept.data.vocab import VocabMap
from dept.model.build import build_model
from dept.train.evaluate import byte_prefix, evaluate_stream
from dept.train.local import (
    ADAM_BETAS,
    adam_step_bound,
    lr_at,
    make_inner_optimizer,
    max_round_update,
    train_local,
)


def test_lr_schedule_is_global(debug_config: DeptConfig) -> None:
    cfg = debug_config
    assert lr_at(0, cfg) == cfg.lr / cfg.warmup_steps
    assert math.isclose(lr_at(cfg.warmup_steps, cfg), cfg.lr)
    last = cfg.total_steps - 1  # steps count from 0
    assert math.isclose(lr_at(last, cfg), cfg.lr * cfg.min_lr_ratio)
    assert lr_at(last - 1, cfg) > lr_at(last, cfg) == lr_at(last + 1, cfg)
    middle = (cfg.warmup_steps + cfg.total_steps) // 2
    assert cfg.lr * cfg.min_lr_ratio < lr_at(middle, cfg) < cfg.lr


def test_local_training_lowers_the_loss(debug_config: DeptConfig) -> None:
    torch.manual_seed(0)
    model = build_model("debug", 64, debug_config.seq_len)
    rng = np.random.default_rng(0)
    tokens = np.tile(rng.integers(0, 64, size=50), 200).astype(np.int32)  # a repeating pattern
    batches = training_batches(tokens, debug_config.seq_len, 4, 0, StreamPosition())
    stats = train_local(
        model,
        make_inner_optimizer(model, debug_config),
        batches,
        debug_config,
        start_step=0,
        desc="test",
    )
    assert stats.steps == debug_config.local_steps
    assert stats.tokens == debug_config.local_steps * 4 * debug_config.seq_len
    assert stats.final_loss < math.log(64) - 0.3


def test_bits_per_byte_of_a_uniform_model() -> None:
    vocab = 50
    model = build_model("debug", vocab, 16)
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()  # logits all zero: uniform over vocab
    tokens = np.arange(161, dtype=np.int32) % vocab
    token_bytes = np.full(vocab, 2)
    result = evaluate_stream(model, tokens, token_bytes, seq_len=16, batch_size=3)
    assert result.tokens == 160 and result.bytes == 320
    assert math.isclose(result.loss, math.log(vocab), rel_tol=1e-5)
    assert math.isclose(result.bits_per_byte, math.log2(vocab) / 2, rel_tol=1e-5)
    capped = evaluate_stream(model, tokens, token_bytes, seq_len=16, batch_size=3, max_bytes=95)
    assert capped.tokens == 48 and capped.bytes == 96  # the window reaching 95 bytes, short last
    assert math.isclose(capped.bits_per_byte, result.bits_per_byte, rel_tol=1e-5)


def test_byte_budget_covers_the_same_text_whatever_the_tokenizer() -> None:
    fine = np.ones(200, dtype=np.int32)  # a 1-byte-per-token tokenizer
    coarse = np.full(60, 2, dtype=np.int32)  # a 4-bytes-per-token tokenizer of the same text
    token_bytes = np.array([0, 1, 4])
    assert token_bytes[byte_prefix(fine, token_bytes, 100)[1:]].sum() == 100
    assert token_bytes[byte_prefix(coarse, token_bytes, 100)[1:]].sum() == 100
    assert len(byte_prefix(fine, token_bytes, 0)) == 200


def test_tokens_outside_vk_share_the_other_row() -> None:
    global_vocab, kept = 40, np.arange(9)  # local rows: 9 kept + 1 "other"
    vmap = VocabMap(kept, global_vocab)
    model = build_model("debug", vmap.local_vocab_size, 16)
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    tokens = np.full(33, 30, dtype=np.int32)  # every target is outside V_k
    result = evaluate_stream(
        model, tokens, np.ones(global_vocab), seq_len=16, batch_size=2, vocab_map=vmap
    )
    # equal logits: the "other" row counts once for each of the 31 ids it stands for, so
    # the model is uniform over the 40 global ids, as its export is
    assert math.isclose(result.loss, math.log(global_vocab), rel_tol=1e-5)


def test_adam_bound_holds_for_every_step_count() -> None:
    b1, b2 = ADAM_BETAS
    bound = adam_step_bound()
    for t in range(1, 3000):
        ratio = sum((b1 * b1 / b2) ** j for j in range(t))
        reach = (1 - b1) / (1 - b1**t) * math.sqrt((1 - b2**t) / (1 - b2) * ratio)
        assert reach <= bound + 1e-12, t


@pytest.mark.parametrize("gradients", ["constant", "adversarial", "heavy-tailed"])
def test_no_round_of_adamw_moves_a_weight_beyond_max_round_update(
    debug_config: DeptConfig, gradients: str
) -> None:
    # Prepare: a weight trained as a client trains, on the round's schedule
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(64, generator=generator) * 3
    weight = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.AdamW(
        [weight], lr=debug_config.lr, betas=ADAM_BETAS, weight_decay=debug_config.weight_decay
    )
    # Execute
    for step in range(debug_config.local_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, debug_config)
        if gradients == "constant":
            weight.grad = torch.ones(64)
        elif gradients == "adversarial":  # tiny, then one huge of the same sign: |m/√v| peaks
            weight.grad = torch.full((64,), 1e-6 if step < debug_config.local_steps - 1 else 1e3)
        else:
            weight.grad = torch.randn(64, generator=generator) ** 3 * 100
        optimizer.step()
    # Assert
    moved = float((weight.detach() - start).abs().max())
    bound = max_round_update(debug_config, 0, float(start.abs().max()))
    assert 0 < moved <= bound
