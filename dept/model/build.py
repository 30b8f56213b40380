"""A model of a family built from its config, initialised the same way for every family and
every vocabulary: θ drawn from the run seed in name order (matrices N(0, 0.02), biases 0, norm
scales 1; a family may scale its residual projections by 1/sqrt(2 · layers), as GPT-2 does),
then ψ (N(0, 0.02)); φ from the same seed before them."""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.initialization import no_init_weights

from dept.model.attention import register_causal_sdpa
from dept.model.families import INIT_STD, Family, build_config, model_choice
from dept.model.roles import body_parameters, position_parameters


def build_model(
    name: str,
    vocab_size: int,
    max_seq_len: int,
    *,
    tie_embeddings: bool = True,
    seed: int = 0,
    device: torch.device | str | None = None,
    activation_checkpointing: bool = False,
    initialise: bool = True,
) -> PreTrainedModel:
    """A freshly initialised model; the same ``seed`` gives the same θ for any vocabulary
    (``activation_checkpointing``: see :func:`checkpoint_activations`).

    It is built on ``device`` (default: torch's default device), so a CUDA model is never a
    CPU copy first. Its draws come from that device's generator: the same θ on every CPU,
    another on CUDA (a client's are all replaced by the server's θ and its own φ_k).
    ``initialise=False`` draws nothing and leaves the parameters as allocated, for a model
    whose every parameter is loaded next (drawing a large body costs seconds of a core)."""
    # flash attention where it can (dept.model.attention)
    config = build_config(
        name, vocab_size, max_seq_len, tie_embeddings, attention=register_causal_sdpa()
    )
    family = model_choice(name).family
    where = torch.device(device) if device is not None else torch.get_default_device()
    forked = [where] if where.type == "cuda" else []  # the generator drawn from, left as it was
    drawing = contextlib.nullcontext() if initialise else no_init_weights()
    with torch.random.fork_rng(devices=forked), where:
        torch.manual_seed(seed)
        with drawing:
            model = family.model_class(config)
        model.tie_weights()  # no_init_weights skips it with the rest of init_weights
        torch.manual_seed(seed)  # θ from its own seed, whatever the vocabulary drew
        if initialise:
            _initialise(model, family, config.num_hidden_layers)
    if activation_checkpointing:
        checkpoint_activations(model)
    return model


def checkpoint_activations(model: PreTrainedModel) -> None:
    """Keep only each layer's input in training and recompute the rest in the backward pass:
    about a third more compute for a small part of the activation memory, which is what lets
    long, wide micro-batches fit (docs/variants.md). Non-reentrant checkpointing, which gives
    the same gradients; no KV cache, which training never reads."""
    # transformers 5's name for gradient_checkpointing_enable (which now warns)
    model.activation_checkpointing_enable({"use_reentrant": False})
    model.config.use_cache = False


def _initialise(model: PreTrainedModel, family: Family, num_layers: int) -> None:
    norms = {
        id(p)
        for m in model.modules()
        if isinstance(m, nn.LayerNorm) or type(m).__name__.endswith("RMSNorm")
        for p in m.parameters(recurse=False)
    }
    residual_std = INIT_STD / math.sqrt(2 * num_layers)
    with torch.no_grad():
        for name, param in sorted(body_parameters(model).items()):
            if name.endswith("bias"):
                nn.init.zeros_(param)
            elif id(param) in norms:
                nn.init.ones_(param)
            elif param.dim() >= 2:
                residual = name.endswith(family.residual_projections)
                nn.init.normal_(param, mean=0.0, std=residual_std if residual else INIT_STD)
            else:
                raise ValueError(f"{family.name}: no initialisation rule for {name}")
        for param in position_parameters(model).values():
            nn.init.normal_(param, mean=0.0, std=INIT_STD)
