"""Which parameters of a decoder are its body θ, its token embeddings φ and its learned
positions ψ: the split every variant shares some of and keeps the rest of.

φ is found through the Hugging Face accessors (the input embedding, and the output one
where it is untied), never by name; ψ is the family's position module (GPT-2's ``wpe``;
RoPE models have none); θ is every other parameter, so its names and shapes do not depend on
the vocabulary, which is what lets sources with different vocabularies share it. Each
travels as a detached float32 CPU copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import torch
from torch import nn
from transformers import PreTrainedModel

from dept.model.families import family_of

EMBEDDING_NAMES = ("input", "output")  # φ's tensors as they travel (tied: input only)


def embedding_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The input embedding, plus the output embedding when it is a separate tensor."""
    modules: list[nn.Module] = [model.get_input_embeddings()]
    out = model.get_output_embeddings()
    if out is not None and out.weight is not modules[0].weight:
        modules.append(out)
    return modules


def embedding_parameters(model: PreTrainedModel) -> dict[str, nn.Parameter]:
    """φ: ``input`` (and ``output`` when untied) embedding matrices, each (V, C)."""
    modules = embedding_modules(model)
    return {EMBEDDING_NAMES[i]: cast(nn.Parameter, m.weight) for i, m in enumerate(modules)}


def position_parameters(model: PreTrainedModel) -> dict[str, nn.Parameter]:
    """ψ: ``positions``, the learned absolute position embedding (T, C), where there is one."""
    where = family_of(model).positions
    if where is None:
        return {}
    return {"positions": cast(nn.Parameter, model.get_submodule(where).weight)}


def body_parameters(model: PreTrainedModel) -> dict[str, nn.Parameter]:
    """θ: every parameter that is neither a token (φ) nor a position (ψ) embedding."""
    skip = {id(p) for m in embedding_modules(model) for p in m.parameters()}
    skip |= {id(p) for p in position_parameters(model).values()}
    return {n: p for n, p in model.named_parameters() if id(p) not in skip}


def body_state(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """A detached float32 CPU copy of θ, the form it travels in."""
    return _copies(body_parameters(model))


def position_state(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The same of ψ (empty for a model without learned positions)."""
    return _copies(position_parameters(model))


def _copies(params: Mapping[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", torch.float32).clone() for n, p in params.items()}


def check_all_loaded(model: PreTrainedModel, loaded: list[nn.Parameter]) -> None:
    """Refuse a model with a parameter outside ``loaded``: built without initial values
    (``build_model(initialise=False)``), it would train on whatever its memory held."""
    ids = {id(p) for p in loaded}
    left = [name for name, p in model.named_parameters() if id(p) not in ids]
    if left:
        raise RuntimeError(f"parameters neither received nor kept by the source: {left[:3]}")


def load_tensors(
    params: Mapping[str, nn.Parameter], state: Mapping[str, torch.Tensor], what: str
) -> None:
    """Copy ``state`` into ``params``; names and shapes must match exactly (``what`` names
    the tensors in the error: ``body``, ``shared``, a source's saved embeddings)."""
    missing, extra = params.keys() - state.keys(), state.keys() - params.keys()
    if missing or extra:
        raise KeyError(
            f"{what} tensors differ: missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}"
        )
    with torch.no_grad():
        for name, param in params.items():
            if tuple(state[name].shape) != tuple(param.shape):
                raise ValueError(
                    f"{what} tensor {name}: shape {tuple(state[name].shape)} != "
                    f"{tuple(param.shape)}"
                )
            param.copy_(state[name])


def count_params(tensors: Mapping[str, torch.Tensor] | Mapping[str, nn.Parameter]) -> int:
    return sum(t.numel() for t in tensors.values())
