"""Llama-style causal LMs built from presets, and the split into body (θ) and embeddings (φ).

The body is every parameter except the input embedding and, when untied, the output
embedding (found through the HF accessors, not by name), so its names and shapes do not
depend on the vocabulary: that is what lets clients with different vocabularies share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel


@dataclass(frozen=True)
class ModelPreset:
    """Size of a Llama-style decoder (vocabulary size comes from the source's tokenizer)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    num_kv_heads: int | None = None


PRESETS: dict[str, ModelPreset] = {
    "debug": ModelPreset(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128),
    "tiny": ModelPreset(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=352),
    "small": ModelPreset(hidden_size=256, num_layers=6, num_heads=8, intermediate_size=688),
    "125m": ModelPreset(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=2048),
}

INIT_STD = 0.02


def build_model(
    preset: str,
    vocab_size: int,
    max_seq_len: int,
    *,
    tie_embeddings: bool = True,
    seed: int = 0,
) -> PreTrainedModel:
    """A freshly initialised model; the same ``seed`` gives the same body for any vocabulary."""
    spec = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads or spec.num_heads,
        max_position_embeddings=max_seq_len,
        tie_word_embeddings=tie_embeddings,
        initializer_range=INIT_STD,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="sdpa",  # type: ignore[call-arg]  # consumed by PretrainedConfig
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        # Re-draw the body from its own seed so it is independent of the vocabulary size.
        torch.manual_seed(seed)
        for _, param in sorted(body_parameters(model).items()):
            if param.dim() >= 2:
                nn.init.normal_(param, mean=0.0, std=INIT_STD)
            else:
                nn.init.ones_(param)
    return model


def embedding_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The input embedding, plus the output embedding when it is a separate tensor."""
    modules: list[nn.Module] = [model.get_input_embeddings()]
    out = model.get_output_embeddings()
    if out is not None and out.weight is not modules[0].weight:
        modules.append(out)
    return modules


def _embedding_param_ids(model: PreTrainedModel) -> set[int]:
    return {id(p) for m in embedding_modules(model) for p in m.parameters()}


def body_parameters(model: PreTrainedModel) -> dict[str, nn.Parameter]:
    """θ: every parameter that is not a token embedding, by its stable name."""
    skip = _embedding_param_ids(model)
    return {n: p for n, p in model.named_parameters() if id(p) not in skip}


def embedding_parameters(model: PreTrainedModel) -> dict[str, nn.Parameter]:
    """φ: ``input`` (and ``output`` when untied) embedding matrices, each (V, C)."""
    modules = embedding_modules(model)
    names = ["input", "output"]
    return {names[i]: cast(nn.Parameter, m.weight) for i, m in enumerate(modules)}


def body_state(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """A detached float32 CPU copy of θ, the form it travels in."""
    return {
        n: p.detach().to("cpu", torch.float32).clone() for n, p in body_parameters(model).items()
    }


def load_body(model: PreTrainedModel, state: dict[str, torch.Tensor]) -> None:
    """Copy θ into ``model``; names and shapes must match exactly."""
    params = body_parameters(model)
    missing, extra = params.keys() - state.keys(), state.keys() - params.keys()
    if missing or extra:
        raise KeyError(
            f"body keys differ: missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}"
        )
    with torch.no_grad():
        for name, param in params.items():
            if tuple(state[name].shape) != tuple(param.shape):
                raise ValueError(
                    f"body tensor {name}: shape {tuple(state[name].shape)} != {tuple(param.shape)}"
                )
            param.copy_(state[name])


def count_params(tensors: dict[str, torch.Tensor] | dict[str, nn.Parameter]) -> int:
    return sum(t.numel() for t in tensors.values())
