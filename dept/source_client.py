"""One data source as a DEPT participant: it trains the shared body with its own embeddings.

This is the whole client side of a round, free of Flower: take θ from the server, attach φ_k
(created on first participation, then reloaded from the node's state), train N local steps
on the source's stream from where the last round stopped, store φ_k and the stream position,
and return the pseudo-gradient Δ_k = θ_global − θ_local.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from transformers import PreTrainedModel

from dept.config import DeptConfig
from dept.data import TokenizedSource, load_source_text, tokenize_source, training_batches
from dept.evaluate import EvalResult, evaluate_stream
from dept.model import body_state, build_model, count_params, embedding_parameters, load_body
from dept.sources import SourceSpec
from dept.synthetic import oracle_bpb
from dept.train import TrainStats, make_inner_optimizer, resolve_device, train_local
from dept.vocab import (
    VocabMap,
    load_tokenizer,
    source_vocabulary,
    token_byte_lengths,
    tokenizer_digest,
)
from dept.workspace import Workspace, global_tokenizer, init_embeddings, own_tokenizer

log = logging.getLogger(__name__)


@dataclass
class RoundResult:
    delta: dict[str, torch.Tensor]  # θ_global − θ_local, float32 on CPU
    stats: TrainStats


class SourceClient:
    """Everything one source needs for a round; cheap to rebuild, state lives on disk."""

    def __init__(
        self,
        cfg: DeptConfig,
        spec: SourceSpec,
        workspace: Workspace,
        all_sources: list[SourceSpec] | None = None,
        global_tokenizer_file: Path | None = None,
    ) -> None:
        self.cfg, self.spec, self.ws = cfg, spec, workspace
        self.device = resolve_device(cfg.device)
        text = load_source_text(spec, workspace.cache, cfg.seed)
        if cfg.variant == "spec-opt":
            tok_path = own_tokenizer(spec, text, workspace.cache, cfg.seed)
        else:
            tok_path = global_tokenizer_file or global_tokenizer(
                all_sources or [spec], cfg.global_vocab_size, workspace.cache, cfg.seed
            )
        self.tokenizer = load_tokenizer(tok_path)
        self.tokens: TokenizedSource = tokenize_source(
            text, self.tokenizer, tokenizer_digest(tok_path), workspace.cache / "tokens" / spec.name
        )
        self.token_bytes = token_byte_lengths(self.tokenizer)
        self.vocab_map = self._vocab_map() if cfg.variant == "spec" else None
        self.oracle_bpb = oracle_bpb(text.folder) if text.folder else None

    def _vocab_map(self) -> VocabMap:
        ids = self.ws.load_vocab_ids()
        if ids is None:
            ids = source_vocabulary(self.tokens.train, self.tokenizer)
            self.ws.save_vocab_ids(ids)
        return VocabMap(ids, len(self.tokenizer))

    @property
    def vocab_size(self) -> int:
        """Rows of this source's embedding matrix (|V_k| + 1 for SPEC)."""
        return self.vocab_map.local_vocab_size if self.vocab_map else len(self.tokenizer)

    def model(self, body: dict[str, torch.Tensor]) -> PreTrainedModel:
        """θ from the server plus this source's φ_k (created and saved on first use)."""
        model = build_model(
            self.cfg.model,
            self.vocab_size,
            self.cfg.seq_len,
            tie_embeddings=self.cfg.tie_embeddings,
            seed=self.cfg.seed,
        )
        load_body(model, body)
        embeddings = embedding_parameters(model)
        stored = self.ws.load_embeddings()
        if stored is None:
            shapes = {k: tuple(p.shape) for k, p in embeddings.items()}
            stored = init_embeddings(shapes, self.cfg.seed, self.spec.name)  # type: ignore[arg-type]
            self.ws.save_embeddings(stored)
        with torch.no_grad():
            for name, param in embeddings.items():
                param.copy_(stored[name])
        return cast(PreTrainedModel, model.to(self.device))  # type: ignore[arg-type]

    def embedding_params(self) -> int:
        return count_params(self.ws.load_embeddings() or {})

    def train_round(
        self, body: dict[str, torch.Tensor], global_step: int, server_round: int
    ) -> RoundResult:
        model = self.model(body)
        optimizer = make_inner_optimizer(model, self.cfg)
        saved = self.ws.load_optimizer() if self.cfg.keep_inner_optimizer else None
        if saved is not None:
            optimizer.load_state_dict(saved)
        position = self.ws.load_position()
        batches = training_batches(
            self.tokens.train, self.cfg.seq_len, self.cfg.batch_size, self.cfg.seed, position
        )
        if self.vocab_map is not None:
            batches = (self.vocab_map.to_local(b) for b in batches)
        stats = train_local(
            model,
            optimizer,
            batches,
            self.cfg,
            start_step=global_step,
            desc=f"round {server_round} {self.spec.name}",
        )
        local = body_state(model)
        delta = {name: body[name].float() - local[name] for name in body}
        self.ws.save_embeddings(dict(embedding_parameters(model)))
        self.ws.save_position(position)
        if self.cfg.keep_inner_optimizer:
            self.ws.save_optimizer(optimizer.state_dict())
        return RoundResult(delta, stats)

    def evaluate(self, body: dict[str, torch.Tensor]) -> EvalResult:
        return evaluate_stream(
            self.model(body),
            self.tokens.validation,
            self.token_bytes,
            seq_len=self.cfg.seq_len,
            batch_size=self.cfg.eval_batch_size,
            max_tokens=self.cfg.eval_tokens,
            vocab_map=self.vocab_map,
        )
