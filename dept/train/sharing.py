"""What of a model travels to the server and what stays on the source's node, by variant.

The shared tensors are θ (always), ψ where the variant aggregates positions, and φ where the
server holds a global vocabulary's embeddings (whole for GLOB; TRIM sends each source only
the leading rows it holds, :func:`shared_rows`). The rest (φ_k, ψ_k) is the source's own and
lives in its state directory. Names: θ's parameter names, ``positions`` for ψ, ``input`` and
``output`` for φ (:mod:`dept.model.families`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from dept.config import DeptConfig
from dept.model.build import build_model
from dept.model.roles import (
    body_parameters,
    body_state,
    embedding_parameters,
    position_parameters,
    position_state,
)
from dept.model.variants import Variant, variant
from dept.train.budget import shared_vocab_size

INITIAL_BODY_VOCAB = 512  # the body does not depend on it; any size builds the same θ


def shared_parameters(model: PreTrainedModel, v: Variant) -> dict[str, nn.Parameter]:
    """θ, plus ψ and φ where ``v`` shares them (φ whole: TRIM's rows are cut on the way)."""
    shared = dict(body_parameters(model))
    if v.shares_positions:
        shared |= position_parameters(model)
    if v.shares_embeddings:
        shared |= embedding_parameters(model)
    return shared


def own_parameters(model: PreTrainedModel, v: Variant) -> dict[str, nn.Parameter]:
    """What the source's node keeps between rounds: φ_k (all of it, for TRIM too: its
    leading rows are then overwritten by the server's) and ψ_k where positions stay home."""
    own = dict(embedding_parameters(model)) if v.keeps_embeddings else {}
    if not v.shares_positions:
        own |= position_parameters(model)
    return own


def initial_tensors(cfg: DeptConfig) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """What the server holds and shares at the start (float32, CPU), and which of it is φ."""
    model = build_model(
        cfg.model,
        shared_vocab_size(cfg) or INITIAL_BODY_VOCAB,
        cfg.seq_len,
        tie_embeddings=cfg.tie_embeddings,
        seed=cfg.seed,
    )
    v = variant(cfg.variant)
    names = tuple(embedding_parameters(model)) if v.shares_embeddings else ()
    return shared_state(model, v, shared_vocab_size(cfg)), names


def shared_state(model: PreTrainedModel, v: Variant, rows: int) -> dict[str, torch.Tensor]:
    """What a source sends back after training: θ and ψ as they are, φ's first ``rows``
    (all of them for GLOB, the V_k rows for TRIM), detached float32 copies on the CPU."""
    state = body_state(model)
    if v.shares_positions:
        state |= position_state(model)
    if v.shares_embeddings:
        state |= {
            n: p[:rows].detach().to("cpu", torch.float32).clone()
            for n, p in embedding_parameters(model).items()
        }
    return state
