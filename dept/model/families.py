"""The registry of model families: what a run's ``model`` key names and the Hugging Face
config it builds.

``model`` names ``<family>:<size>`` (``llama:tiny``, ``gpt2:debug``; a bare size means
Llama) or a Hugging Face ``config.json`` of a family below. A family says its HF classes, how
a size maps to config keys, its context-length key, its position module (ψ) if any and its
residual projections. Which parameters are θ, φ and ψ is :mod:`dept.model.roles`; building
and initialising a model is :mod:`dept.model.build`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dept.paths import resolve_path

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

INIT_STD = 0.02
DEFAULT_FAMILY = "llama"  # what a bare size (``tiny``) means
# config.json keys that describe a checkpoint, not an architecture: the run sets its own.
NOT_ARCHITECTURE = {
    "architectures",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "model_type",
    "vocab_size",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
}


@dataclass(frozen=True)
class Size:
    """Dimensions of one preset (the vocabulary comes from the source's tokenizer)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int  # Llama's SwiGLU width; GPT-2 uses 4 x hidden_size
    num_kv_heads: int | None = None


def swiglu_width(hidden_size: int, multiple: int = 256) -> int:
    """Llama's SwiGLU width: 8/3 x C (its three matrices then weigh what GPT-2's two 4 x C
    ones do), rounded up to a ``multiple`` (256 in Llama's reference code)."""
    return multiple * math.ceil(8 * hidden_size / 3 / multiple)


# 125m, 350m and 1.3b are the shapes of the DEPT authors' MPT configs (C x layers x heads);
# GPT-2's MLP (4 x C, GELU) is MPT's, Llama's SwiGLU is 2048, 2816 and 5632 wide.
SIZES: dict[str, Size] = {
    # Size(C, layers, heads, Llama's SwiGLU width)
    "debug": Size(64, 2, 4, 128),
    "tiny": Size(128, 4, 4, swiglu_width(128, multiple=32)),
    "small": Size(256, 6, 8, swiglu_width(256, multiple=16)),
    "125m": Size(768, 12, 12, swiglu_width(768)),
    "350m": Size(1024, 24, 16, swiglu_width(1024)),
    "1.3b": Size(2048, 24, 16, swiglu_width(2048)),
}


def _llama(size: Size) -> dict[str, Any]:
    return {
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.num_layers,
        "num_attention_heads": size.num_heads,
        "num_key_value_heads": size.num_kv_heads or size.num_heads,
    }


def _gpt2(size: Size) -> dict[str, Any]:
    return {"n_embd": size.hidden_size, "n_layer": size.num_layers, "n_head": size.num_heads}


def _llama_body(size: Size) -> int:
    """θ of a Llama preset: q, k, v and o projections (k and v narrower with fewer KV
    heads), the SwiGLU's three matrices and two RMSNorm scales a layer, and the final norm;
    no biases."""
    c, kv = size.hidden_size, (size.num_kv_heads or size.num_heads)
    kv_width = kv * (c // size.num_heads)
    layer = 2 * c * c + 2 * c * kv_width + 3 * c * size.intermediate_size + 2 * c
    return size.num_layers * layer + c


def _gpt2_body(size: Size) -> int:
    """θ of a GPT-2 preset: a layer's fused qkv (3C) and output projection, its 4C MLP, all
    with biases, and two LayerNorms (scale and bias); then the final LayerNorm."""
    c = size.hidden_size
    layer = (3 * c * c + 3 * c) + (c * c + c) + (8 * c * c + 5 * c) + 4 * c
    return size.num_layers * layer + 2 * c


@dataclass(frozen=True)
class Family:
    """One decoder architecture: its HF classes, its presets and where ψ lives.

    The classes are named, and imported from transformers when first used: a model class
    pulls in most of torch and transformers (seconds), which ``dept run``'s checks of a
    ``model`` value, made before anything starts, never need."""

    name: str
    model_type: str  # the HF config's ``model_type``: how a config.json names the family
    config_class_name: str
    model_class_name: str
    size_settings: Callable[[Size], dict[str, Any]]  # HF config kwargs of a preset
    # θ's parameter count of a preset, without building it (dept run sizes a run before
    # it starts; a model class costs seconds to import). A test holds it to the built one.
    body_size: Callable[[Size], int]
    max_positions_key: str  # the HF config key of the context length
    positions: str | None = None  # the module holding ψ (learned positions); None: RoPE
    # Matrices writing into the residual stream, drawn with std / sqrt(2 x layers). Llama
    # keeps the plain init its results were measured with.
    residual_projections: tuple[str, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)  # kwargs of every model of it
    sizes: Mapping[str, Size] = field(default_factory=lambda: SIZES)

    @property
    def config_class(self) -> type[PretrainedConfig]:
        import transformers  # late: its import alone takes a second that checks never need

        return getattr(transformers, self.config_class_name)

    @property
    def model_class(self) -> type[PreTrainedModel]:
        import transformers

        return getattr(transformers, self.model_class_name)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "llama",
            "llama",
            "LlamaConfig",
            "LlamaForCausalLM",
            _llama,
            _llama_body,
            "max_position_embeddings",
            fixed={"attention_dropout": 0.0},  # as GPT-2's, below
        ),
        Family(
            "gpt2",
            "gpt2",
            "GPT2Config",
            "GPT2LMHeadModel",
            _gpt2,
            _gpt2_body,
            "n_positions",
            positions="transformer.wpe",
            residual_projections=("attn.c_proj.weight", "mlp.c_proj.weight"),
            # Pre-training sees each token about once: dropout only slows it (nanoGPT's 0).
            # It would also draw from torch's global RNG, which no round seeds: two runs of
            # one config, or a run and its resume, would train differently.
            fixed={"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
        ),
    )
}


@dataclass(frozen=True)
class ModelChoice:
    """What a ``model`` value names: a family and its architecture settings."""

    family: Family
    settings: Mapping[str, Any]  # HF config kwargs, before vocabulary, context and tying
    from_file: bool  # a config.json keeps its own context length; a preset takes seq-len
    size: Size | None = None  # a preset's


@functools.cache
def model_choice(name: str) -> ModelChoice:
    """Parse a ``model`` value: a preset (``family:size``, or a bare size of the default
    family) or else a config file or its folder; ``ValueError`` names what is wrong."""
    family_name, _, size = name.rpartition(":")
    family = FAMILIES.get(family_name or DEFAULT_FAMILY)
    if family is not None and size in family.sizes:
        preset = family.sizes[size]
        return ModelChoice(family, family.size_settings(preset), from_file=False, size=preset)
    if name.endswith(".json") or "/" in name or _resolve(name).exists():
        return _from_config_file(name)
    if family is None:
        raise ValueError(
            f"{name!r} names no model family (known: {', '.join(FAMILIES)}; "
            "write <family>:<size>, a size, or a path to a config.json)"
        )
    raise ValueError(
        f"{name!r}: family {family.name} has no size {size!r} (sizes: {', '.join(family.sizes)})"
    )


def _resolve(name: str) -> Path:
    return resolve_path(name)


def _from_config_file(name: str) -> ModelChoice:
    path = _resolve(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"{name!r}: no such Hugging Face config file ({path})")
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a readable JSON config: {exc}") from exc
    model_type = settings.get("model_type") if isinstance(settings, dict) else None
    family = next((f for f in FAMILIES.values() if f.model_type == model_type), None)
    if family is None:
        supported = ", ".join(f.model_type for f in FAMILIES.values())
        raise ValueError(f"{path}: model_type {model_type!r} is not supported ({supported})")
    kept = {k: v for k, v in settings.items() if k not in NOT_ARCHITECTURE}
    return ModelChoice(family, kept, from_file=True)


def build_config(
    name: str, vocab_size: int, max_seq_len: int, tie: bool, *, attention: str | None = None
) -> PretrainedConfig:
    """The HF config of ``name`` for a vocabulary and a context (``ValueError`` if the
    config file's context is shorter than ``max_seq_len``). ``attention`` is the
    ``attn_implementation`` a model is built with (:mod:`dept.model.build` gives
    :mod:`dept.model.attention`'s); a config that is only checked or measured needs none."""
    choice = model_choice(name)
    family = choice.family
    settings: dict[str, Any] = {
        **choice.settings,
        **family.fixed,  # over a config file's too: what the family always trains with
        "vocab_size": vocab_size,
        "tie_word_embeddings": tie,
        "initializer_range": INIT_STD,
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if attention is not None:
        settings["attn_implementation"] = attention
    if not choice.from_file:
        settings[family.max_positions_key] = max_seq_len
    config = family.config_class(**settings)
    context = getattr(config, family.max_positions_key)
    if context < max_seq_len:
        raise ValueError(
            f"model {name!r} holds {context} positions ({family.max_positions_key}), fewer "
            f"than seq-len {max_seq_len}"
        )
    return config


def family_of(model: PreTrainedModel) -> Family:
    return next(f for f in FAMILIES.values() if f.model_type == model.config.model_type)


@functools.cache  # asked for every reply a client sends (its embedding_params)
def model_width(name: str) -> int:
    """Hidden size C of ``name``: the width of every φ and ψ row (a preset's own, without
    importing its config class: sizing a run before it starts needs it)."""
    choice = model_choice(name)
    if choice.size is not None:
        return choice.size.hidden_size
    return int(choice.family.config_class(**choice.settings).hidden_size)


@functools.cache
def position_count(name: str, max_seq_len: int) -> int:
    """ψ's parameters (0 for a model without learned positions)."""
    choice = model_choice(name)
    if choice.family.positions is None:
        return 0
    if not choice.from_file:  # a preset holds as many positions as the run's context
        return max_seq_len * model_width(name)
    config = build_config(name, 512, max_seq_len, True)
    return int(getattr(config, choice.family.max_positions_key)) * model_width(name)
