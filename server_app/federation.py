"""The server's run: validate the config, build θ and the strategy, run the rounds, report.

Round 0 evaluates the untrained body with every source's fresh embeddings (the "before"
column); each round then trains, aggregates and evaluates, and a line goes to
``metrics.jsonl`` before the next round starts.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from dept.config import DeptConfig, load_config, resolve_path
from dept.model import body_state, build_model, embedding_parameters
from dept.sources import run_sources
from dept_strategy.outer import OuterOptimizer
from dept_strategy.strategy import DeptStrategy
from server_app.report import RunReport

log = logging.getLogger(__name__)
INITIAL_BODY_VOCAB = 512  # the body does not depend on it; any size builds the same θ


def run_federation(grid: Grid, run_config: Mapping[str, Any]) -> Path:
    """Run every round; returns the output folder. Bad config fails before any training."""
    cfg = load_config(run_config)
    declared = {s.name for s in run_sources(cfg)}  # parses and validates the sources file
    out_dir = resolve_path(cfg.output_dir)
    log.info(
        "DEPT %s: model %s, %d rounds x %d local steps; output in %s",
        cfg.variant,
        cfg.model,
        cfg.num_server_rounds,
        cfg.local_steps,
        out_dir,
    )
    strategy = _build_strategy(cfg)
    strategy.summary()
    owners = strategy.wait_for_sources(grid)  # each node checks its own data paths
    log.info("%d sources take part: %s", len(owners), ", ".join(sorted(owners)))
    if cfg.sources_file and (missing := sorted(declared - owners.keys())):
        log.warning("no node serves %s yet; a source joins when its node does", ", ".join(missing))
    report = RunReport(out_dir, cfg)
    started = time.monotonic()
    _evaluate(grid, strategy, cfg, 0)
    report.round_done(strategy.history, 0, time.monotonic() - started)
    for server_round in range(1, cfg.num_server_rounds + 1):
        _train(grid, strategy, cfg, server_round)
        if server_round == 1 and not strategy.history.rounds[1].train:
            reasons = {f["reason"] for f in strategy.history.rounds[1].failed}
            reasons |= {r["reason"] for r in strategy.history.rounds[1].rejected}
            raise RuntimeError(f"no source could train in round 1: {'; '.join(sorted(reasons))}")
        _evaluate(grid, strategy, cfg, server_round)
        report.round_done(strategy.history, server_round, time.monotonic() - started)
    shared = strategy.outer.tensors()
    embeddings = {n: shared.pop(n) for n in strategy.embedding_names}
    report.finish(strategy.history, shared, time.monotonic() - started, embeddings)
    return out_dir


def initial_tensors(cfg: DeptConfig) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """What the server holds and shares: θ, plus the global φ for GLOB and TRIM (its names)."""
    shares_embeddings = cfg.variant in ("glob", "trim")
    vocab = cfg.global_vocab_size if shares_embeddings else INITIAL_BODY_VOCAB
    model = build_model(
        cfg.model, vocab, cfg.seq_len, tie_embeddings=cfg.tie_embeddings, seed=cfg.seed
    )
    tensors = body_state(model)
    if not shares_embeddings:
        return tensors, ()
    embeddings = {n: p.detach().clone() for n, p in embedding_parameters(model).items()}
    return {**tensors, **embeddings}, tuple(embeddings)


def _build_strategy(cfg: DeptConfig) -> DeptStrategy:
    tensors, embedding_names = initial_tensors(cfg)
    outer = OuterOptimizer(
        tensors, kind=cfg.outer_optimizer, lr=cfg.outer_lr, momentum=cfg.outer_momentum
    )
    return DeptStrategy(
        outer=outer,
        embedding_names=embedding_names,
        trim=cfg.variant == "trim",
        local_steps=cfg.local_steps,
        run_id=uuid.uuid4().hex[:12],
        fraction_train=cfg.fraction_train,
        min_train_nodes=cfg.min_train_nodes,
        fraction_evaluate=cfg.fraction_evaluate,
        min_available_nodes=cfg.min_available_nodes,
        wait_for_nodes_s=cfg.wait_for_nodes_s,
        query_timeout_s=cfg.wait_for_nodes_s,
        max_tokens_per_round=cfg.local_steps * cfg.grad_accum_steps * cfg.batch_size * cfg.seq_len,
        num_rounds=cfg.num_server_rounds,
        seed=cfg.seed,
    )


def _body_record(strategy: DeptStrategy) -> ArrayRecord:
    return ArrayRecord(strategy.outer.tensors())


def _train(grid: Grid, strategy: DeptStrategy, cfg: DeptConfig, server_round: int) -> None:
    messages = strategy.configure_train(server_round, _body_record(strategy), ConfigRecord(), grid)
    replies = grid.send_and_receive(messages, timeout=cfg.round_timeout_s)
    strategy.aggregate_train(server_round, replies)


def _evaluate(grid: Grid, strategy: DeptStrategy, cfg: DeptConfig, server_round: int) -> None:
    messages = strategy.configure_evaluate(
        server_round, _body_record(strategy), ConfigRecord(), grid
    )
    replies = grid.send_and_receive(messages, timeout=cfg.round_timeout_s)
    strategy.aggregate_evaluate(server_round, replies)
