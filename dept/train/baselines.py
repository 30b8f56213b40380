"""The paper's baselines: ordinary training on the mixture of sources (STD), and STD with
active forgetting of the token embeddings (ACT); and continued pre-training (CPT), which is
STD started from a trained body with fresh embeddings for a (new) tokenizer.

Both use the one global tokenizer and the same model as GLOB, and are laid out in "rounds"
of ``local-steps`` steps so they line up with the federated runs: the same learning-rate
schedule over ``num-server-rounds × local-steps`` steps, a batch of ``batch-size`` sequences
per source trained in a round (so the same tokens in total), and the same evaluation after
every round.

STD draws each sequence of a batch from source k with probability ∝ n_k^τ (n_k = training
tokens of k): τ = 0 is uniform over sources, τ = 1 proportional to size. Stratified STD
(τ = 0 exactly) takes ``batch-size`` sequences of every source each step, in source order,
each source walking the stream its DEPT client walks: the mean of the per-source gradients
is then the gradient of the step, so one-step SGD GLOB with FedAvg equals it. ACT
re-initialises the embeddings (and clears their optimizer state) every ``act-period``
steps (default ``local-steps``; at a round's end after its evaluation), never at the last
step, so its final model is evaluated with embeddings trained for one period.
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
from dept.data.corpus import load_source_text
from dept.data.sources import SourceSpec
from dept.data.token_stream import StreamPosition, tokenize_source, training_batches
from dept.data.vocab import check_fits, load_tokenizer, token_byte_lengths, tokenizer_digest
from dept.model.build import build_model
from dept.model.families import INIT_STD
from dept.model.roles import (
    body_parameters,
    body_state,
    count_params,
    embedding_parameters,
    load_tensors,
    position_parameters,
    position_state,
)
from dept.state.workspace import global_tokenizer
from dept.train.devices import resolve_device
from dept.train.evaluate import EvalResult, evaluate_stream
from dept.train.local import make_inner_optimizer, train_local

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


def stratified_batches(
    streams: list[np.ndarray], *, seq_len: int, batch_size: int, seed: int
) -> Iterator[np.ndarray]:
    """Endless (sources × batch_size, seq_len + 1) batches: ``batch_size`` sequences of each
    source in source order, from the stream a DEPT client of it draws (the run's seed)."""
    sources = [training_batches(t, seq_len, batch_size, seed, StreamPosition()) for t in streams]
    while True:
        yield np.concatenate([next(s) for s in sources])


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
    forgets: bool = False,
    stratified: bool = False,
    on_round: Callable[[BaselineRound], None] | None = None,
    on_model: Callable[[BaselineRound, PreTrainedModel], None] | None = None,
    body: dict[str, torch.Tensor] | None = None,
    tokenizer_file: Path | None = None,
    name: str | None = None,
) -> BaselineRun:
    """STD (or ACT with ``forgets``) on the mixture of ``specs``.

    ``sources_per_round`` is how many sources a federated round trains, so a step here
    takes ``sources_per_round × batch-size`` sequences: the federated runs' tokens per round.
    ``stratified``: every source's share of each step, in order (τ must be 0, every source
    in a round). ``on_model`` sees each round's record and the model after its evaluation
    (before ACT forgets). CPT: ``body`` is a trained θ to start from (with ψ where the run
    shared it; the token embeddings, and positions a run kept per source, are always fresh)
    and ``tokenizer_file`` the tokenizer to train them for (default: the global one).
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
    name = name or ("ACT" if forgets else f"STD τ={temperature:g}")
    embeddings = count_params(embedding_parameters(model))
    run = BaselineRun(name, embeddings, count_params(dict(model.named_parameters())) - embeddings)
    batches = _batches(cfg, data, name, temperature, sources_per_round, stratified)
    forgetting = Forgetting(model, optimizer, cfg) if forgets else None
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
            after_step=forgetting.within_round if forgetting else None,
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
        if on_model is not None:
            on_model(record, model)
        if forgetting is not None:
            forgetting.at_round_end(record.global_step)
    run.body = {**body_state(model), **position_state(model)}  # one model: ψ shared, like θ
    return run


def _batches(
    cfg: DeptConfig,
    data: list[SourceData],
    name: str,
    temperature: float,
    sources_per_round: int,
    stratified: bool,
) -> Iterator[np.ndarray]:
    """The steps' batches of ``sources_per_round × batch-size`` sequences (see the module)."""
    streams = [d.train for d in data]
    if stratified:
        if temperature != 0 or sources_per_round != len(data):
            raise ValueError(
                f"{name}: stratified batches are τ = 0 with every source in each step, got "
                f"τ = {temperature:g} and {sources_per_round} of {len(data)} sources"
            )
        log.info("%s: %d sequences of each source per step", name, cfg.batch_size)
        return stratified_batches(
            streams, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed
        )
    probs = temperature_probs([len(t) for t in streams], temperature)
    log.info(
        "%s: %s",
        name,
        ", ".join(f"{d.spec.name} {p:.3f}" for d, p in zip(data, probs, strict=True)),
    )
    return mixture_batches(
        streams,
        probs,
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size * sources_per_round,
        seed=cfg.seed,
    )


class Forgetting:
    """ACT's schedule: fresh φ after every ``act-period`` steps but the last; one due at a
    round's end waits for that round's evaluation, so every round scores trained embeddings."""

    def __init__(
        self, model: PreTrainedModel, optimizer: torch.optim.Optimizer, cfg: DeptConfig
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.generator = torch.Generator().manual_seed(cfg.seed + 0xAC7)
        self.resets: list[int] = []  # the global steps after which φ was fresh

    def _due(self, step: int) -> bool:
        return step % self.cfg.forget_period == 0 and step < self.cfg.total_steps

    def _reset(self, step: int) -> None:
        reset_embeddings(self.model, self.optimizer, self.generator)
        self.resets.append(step)

    def within_round(self, step: int) -> None:
        """After each training step (``train_local``'s ``after_step``)."""
        if self._due(step) and step % self.cfg.local_steps:
            self._reset(step)

    def at_round_end(self, step: int) -> None:
        """After the round ending at global ``step`` was evaluated."""
        if self._due(step):
            self._reset(step)


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
