"""The paper's baselines: ordinary training on the mixture of sources (STD), and STD with
active forgetting of the token embeddings (ACT); and continued pre-training (CPT), which is
STD started from a trained body with fresh embeddings for a (new) tokenizer.

Both use the one global tokenizer and the same model as GLOB, and are laid out in "rounds"
of ``local-steps`` steps so they line up with the federated runs: the same learning-rate
schedule over ``num-server-rounds × local-steps`` steps, a batch of ``batch-size`` sequences
per source trained in a round (so the same tokens in total), and the same evaluation after
every round.

STD draws each sequence of a batch from source k with probability ∝ n_k^τ (n_k = training
tokens of k): τ = 0 is uniform over sources, τ = 1 proportional to size. ACT re-initialises
the embeddings (and clears their optimizer state) every ``local-steps`` steps, except after
the last round, so its final model is evaluated with embeddings trained for one period.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel

from dept.config import DeptConfig
from dept.data import StreamPosition, load_source_text, tokenize_source, training_batches
from dept.devices import resolve_device
from dept.evaluate import EvalResult, evaluate_stream
from dept.model import (
    INIT_STD,
    body_parameters,
    body_state,
    build_model,
    count_params,
    embedding_parameters,
    load_tensors,
    position_parameters,
    position_state,
)
from dept.sources import SourceSpec
from dept.train import make_inner_optimizer, train_local
from dept.vocab import check_fits, load_tokenizer, token_byte_lengths, tokenizer_digest
from dept.workspace import global_tokenizer

log = logging.getLogger(__name__)


def temperature_probs(sizes: list[int], temperature: float) -> np.ndarray:
    """Sampling probability per source: ∝ size^τ (τ = 0 uniform, τ = 1 proportional)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"every source needs training tokens, got sizes {sizes}")
    weights = np.asarray(sizes, dtype=np.float64) ** temperature
    return weights / weights.sum()


def mixture_batches(
    streams: list[np.ndarray],
    probs: np.ndarray,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
) -> Iterator[np.ndarray]:
    """Endless (batch_size, seq_len + 1) batches, each row from a source drawn by ``probs``.

    Each source walks its own seeded permutation of blocks, as a DEPT client does.
    """
    rng = np.random.default_rng([seed, len(streams), 0x5D])
    sources = [
        training_batches(tokens, seq_len, 1, seed + i, StreamPosition())
        for i, tokens in enumerate(streams)
    ]
    while True:
        picks = rng.choice(len(streams), size=batch_size, p=probs)
        yield np.concatenate([next(sources[k]) for k in picks])


def reset_embeddings(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, generator: torch.Generator
) -> None:
    """Active forgetting: fresh φ, and no optimizer memory of the old one."""
    with torch.no_grad():
        for param in embedding_parameters(model).values():
            fresh = torch.randn(param.shape, generator=generator) * INIT_STD
            param.copy_(fresh.to(param.device))
            optimizer.state.pop(param, None)


@dataclass
class BaselineRound:
    round: int
    global_step: int
    train_loss: float
    eval: dict[str, EvalResult]
    wall_s: float

    @property
    def avg_val_bpb(self) -> float:
        return float(np.mean([r.bits_per_byte for r in self.eval.values()]))


@dataclass
class BaselineRun:
    """Per-round evaluations of a baseline, what it cost, and the body it ends with."""

    name: str
    embedding_params: int  # φ
    body_params: int  # everything else: θ, and ψ (one model shares its positions, like GLOB)
    tokens_trained: int = 0
    rounds: list[BaselineRound] = field(default_factory=list)
    body: dict[str, torch.Tensor] = field(default_factory=dict)  # θ, and ψ where learned


@dataclass
class SourceData:
    spec: SourceSpec
    train: np.ndarray
    validation: np.ndarray


def tokenized_sources(
    cfg: DeptConfig, specs: list[SourceSpec], state_root: Path, tokenizer_file: Path | None
) -> tuple[list[SourceData], np.ndarray, int]:
    """Every source tokenized with ``tokenizer_file`` (default: the run's global tokenizer),
    the bytes per token id, and the embedding rows the model needs."""
    cache = state_root / "cache"
    path = tokenizer_file or global_tokenizer(specs, cfg.global_vocab_size, cache, cfg.seed)
    tokenizer = load_tokenizer(path)
    rows = len(tokenizer) if tokenizer_file else cfg.global_vocab_size
    check_fits(tokenizer, path, rows)
    digest = tokenizer_digest(path)
    data = []
    for spec in specs:
        text = load_source_text(spec, cache, cfg.seed)
        tokens = tokenize_source(text, tokenizer, digest, cache / "tokens" / spec.name)
        data.append(SourceData(spec, tokens.train, tokens.validation))
    return data, token_byte_lengths(tokenizer), rows


def run_standard(
    cfg: DeptConfig,
    specs: list[SourceSpec],
    state_root: Path,
    *,
    temperature: float,
    sources_per_round: int,
    forget_every_round: bool = False,
    on_round: Callable[[BaselineRound], None] | None = None,
    body: dict[str, torch.Tensor] | None = None,
    tokenizer_file: Path | None = None,
    name: str | None = None,
) -> BaselineRun:
    """STD (or ACT with ``forget_every_round``) on the mixture of ``specs``.

    ``sources_per_round`` is how many sources a federated round trains, so a step here
    takes ``sources_per_round × batch-size`` sequences: the federated runs' tokens per round.
    CPT: ``body`` is a trained θ to start from (with ψ where the run shared it; the token
    embeddings, and positions a run kept per source, are always fresh) and
    ``tokenizer_file`` the tokenizer to train them for (default: the global one).
    """
    data, token_bytes, rows = tokenized_sources(cfg, specs, state_root, tokenizer_file)
    device = resolve_device(cfg.device)
    model = build_model(
        cfg.model,
        rows,
        cfg.seq_len,
        tie_embeddings=cfg.tie_embeddings,
        seed=cfg.seed,
        device=device,
        activation_checkpointing=cfg.activation_checkpointing,
    )
    if body is not None:
        positions = {k: p for k, p in position_parameters(model).items() if k in body}
        load_tensors({**body_parameters(model), **positions}, body, "the pre-trained body")
    optimizer = make_inner_optimizer(model, cfg)
    name = name or ("ACT" if forget_every_round else f"STD τ={temperature:g}")
    embeddings = count_params(embedding_parameters(model))
    run = BaselineRun(name, embeddings, count_params(dict(model.named_parameters())) - embeddings)
    probs = temperature_probs([len(d.train) for d in data], temperature)
    log.info(
        "%s: %s",
        name,
        ", ".join(f"{d.spec.name} {p:.3f}" for d, p in zip(data, probs, strict=True)),
    )
    batches = mixture_batches(
        [d.train for d in data],
        probs,
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size * sources_per_round,
        seed=cfg.seed,
    )
    forget = torch.Generator().manual_seed(cfg.seed + 0xAC7)
    started = time.perf_counter()
    run.rounds.append(BaselineRound(0, 0, math.nan, _evaluate(model, data, token_bytes, cfg), 0.0))
    for server_round in range(1, cfg.num_server_rounds + 1):
        stats = train_local(
            model,
            optimizer,
            batches,
            cfg,
            start_step=(server_round - 1) * cfg.local_steps,
            desc=f"{name} round {server_round}",
        )
        run.tokens_trained += stats.tokens
        evaluated = _evaluate(model, data, token_bytes, cfg)
        record = BaselineRound(
            server_round,
            server_round * cfg.local_steps,
            stats.mean_loss,
            evaluated,
            time.perf_counter() - started,
        )
        run.rounds.append(record)
        if on_round is not None:
            on_round(record)
        if forget_every_round and server_round < cfg.num_server_rounds:
            reset_embeddings(model, optimizer, forget)
    run.body = {**body_state(model), **position_state(model)}  # one model: ψ shared, like θ
    return run


def _evaluate(
    model: PreTrainedModel, data: list[SourceData], token_bytes: np.ndarray, cfg: DeptConfig
) -> dict[str, EvalResult]:
    return {
        d.spec.name: evaluate_stream(
            model,
            d.validation,
            token_bytes,
            seq_len=cfg.seq_len,
            batch_size=cfg.eval_batch_size,
            max_bytes=cfg.eval_bytes,
        )
        for d in data
    }
