import json
import math
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, LlamaConfig

from dept.config import ConfigError, load_config
from dept.model.build import build_model
from dept.model.families import FAMILIES, SIZES, Size, model_choice, position_count, swiglu_width
from dept.model.roles import (
    body_parameters,
    body_state,
    count_params,
    embedding_parameters,
    load_tensors,
    position_parameters,
)
from dept.train.local import next_token_loss

MODELS = ["debug", "gpt2:debug"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tie", [True, False])
def test_body_is_identical_for_any_vocabulary(model: str, tie: bool) -> None:
    small = body_state(build_model(model, 300, 32, tie_embeddings=tie, seed=3))
    large = body_state(build_model(model, 5000, 32, tie_embeddings=tie, seed=3))
    assert small.keys() == large.keys()
    for name in small:
        assert torch.equal(small[name], large[name]), name
    assert not any(part in n for n in small for part in ("embed", "lm_head", "wte", "wpe"))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tie", [True, False])
def test_body_tokens_and_positions_partition_the_model(model: str, tie: bool) -> None:
    built = build_model(model, 300, 32, tie_embeddings=tie)
    parts = [body_parameters(built), embedding_parameters(built), position_parameters(built)]
    assert sum(count_params(p) for p in parts) == sum(p.numel() for p in built.parameters())
    assert count_params(parts[2]) == position_count(model, 32)


def test_gpt2_learns_its_positions_and_llama_rotates() -> None:
    gpt2 = position_parameters(build_model("gpt2:debug", 300, 48))
    assert list(gpt2) == ["positions"] and gpt2["positions"].shape == (48, 64)
    assert position_parameters(build_model("llama:debug", 300, 48)) == {}


def test_initialisation_zeroes_biases_sets_norms_to_one_and_scales_residuals() -> None:
    params = dict(build_model("gpt2:small", 300, 64, seed=1).named_parameters())
    biases = [p for n, p in params.items() if n.endswith("bias")]
    assert biases and all(torch.count_nonzero(p) == 0 for p in biases)
    norms = [p for n, p in params.items() if ".ln_" in n and n.endswith("weight")]
    assert norms and all(torch.all(p == 1) for p in norms)
    plain = params["transformer.h.0.attn.c_attn.weight"].std().item()
    scaled = params["transformer.h.0.mlp.c_proj.weight"].std().item()
    assert plain == pytest.approx(0.02, rel=0.05)
    assert scaled == pytest.approx(0.02 / math.sqrt(2 * 6), rel=0.05)


def test_a_bare_size_means_llama_and_names_are_checked() -> None:
    assert model_choice("tiny").family is FAMILIES["llama"]
    assert model_choice("gpt2:tiny").family is FAMILIES["gpt2"]
    with pytest.raises(ConfigError, match="'bert:tiny' names no model family"):
        load_config({"model": "bert:tiny"})
    with pytest.raises(ConfigError, match="family gpt2 has no size 'huge'"):
        load_config({"model": "gpt2:huge"})


def test_a_hugging_face_config_file_names_a_model(tmp_path: Path) -> None:
    gpt2 = GPT2Config(n_embd=48, n_layer=3, n_head=4, n_positions=256, vocab_size=50257)
    gpt2.save_pretrained(tmp_path / "gpt2")
    llama = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=32000,
    )
    (tmp_path / "llama.json").write_text(llama.to_json_string())

    from_dir = build_model(str(tmp_path / "gpt2"), 300, 128)
    from_file = build_model(str(tmp_path / "llama.json"), 300, 128)

    assert from_dir.config.n_layer == 3 and from_dir.config.vocab_size == 300
    assert position_parameters(from_dir)["positions"].shape == (256, 48)  # the file's context
    assert from_file.config.num_key_value_heads == 2
    with pytest.raises(ConfigError, match=r"holds 256 positions .* fewer than seq-len 512"):
        load_config({"model": str(tmp_path / "gpt2"), "seq-len": 512})
    (tmp_path / "bert.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ConfigError, match="model_type 'bert' is not supported"):
        load_config({"model": str(tmp_path / "bert.json")})
    with pytest.raises(ConfigError, match="no such Hugging Face config file"):
        load_config({"model": str(tmp_path / "missing.json")})


@pytest.mark.parametrize(
    ("config", "dropout"),
    [
        (
            LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4),
            {"attention_dropout": 0.5},
        ),
        (
            GPT2Config(n_embd=32, n_layer=2, n_head=4),
            {"resid_pdrop": 0.5, "embd_pdrop": 0.5, "attn_pdrop": 0.5},
        ),
    ],
)
def test_a_config_file_with_dropout_trains_without_it(
    tmp_path: Path, config: LlamaConfig | GPT2Config, dropout: dict[str, float]
) -> None:
    # Prepare: a config.json asking for dropout, which would draw from the unseeded global RNG
    config.update({**dropout, "num_hidden_layers": 2})
    (tmp_path / "config.json").write_text(config.to_json_string())
    model = build_model(str(tmp_path / "config.json"), 300, 64).train()
    batch = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(0))
    # Execute: two forward passes in training mode
    losses = [next_token_loss(model, batch).item() for _ in range(2)]
    # Assert
    assert losses[0] == losses[1]
    assert all(getattr(model.config, key) == 0.0 for key in dropout)


def test_tied_and_untied_embeddings() -> None:
    tied = embedding_parameters(build_model("debug", 300, 32, tie_embeddings=True))
    untied = embedding_parameters(build_model("debug", 300, 32, tie_embeddings=False))
    assert list(tied) == ["input"] and list(untied) == ["input", "output"]
    assert tied["input"].shape == (300, 64)


def test_load_tensors_checks_names_and_shapes() -> None:
    model = build_model("debug", 300, 32)
    state = body_state(build_model("debug", 300, 32, seed=9))
    load_tensors(body_parameters(model), state, "body")
    assert all(torch.equal(body_state(model)[n], state[n]) for n in state)
    name = next(iter(state))
    with pytest.raises(KeyError):
        load_tensors(body_parameters(model), {k: v for k, v in state.items() if k != name}, "body")
    with pytest.raises(ValueError, match=name):
        load_tensors(body_parameters(model), {**state, name: torch.zeros(1)}, "body")


def expected_body(family: str, size: Size) -> int:
    """θ of a preset by hand: the architecture the registry means, not what HF happens to build."""
    c, layers, f = size.hidden_size, size.num_layers, size.intermediate_size
    if family == "llama":  # q, k, v, o; gate, up, down; two RMSNorm scales a layer, a final one
        return layers * (4 * c * c + 3 * c * f + 2 * c) + c
    # GPT-2: qkv and proj, fc (4C) and proj, with biases; two LayerNorms a layer, a final one
    return layers * (12 * c * c + 13 * c) + 2 * c


PRESETS = [(f.name, size) for f in FAMILIES.values() for size in f.sizes]
# The DEPT paper's sizes name total parameters (MPT, with its 50,368-row embedding); θ alone
# is a little smaller.
BODY_RANGES = {"125m": (80e6, 90e6), "350m": (290e6, 320e6), "1.3b": (1.2e9, 1.4e9)}


@pytest.mark.parametrize(("family", "size"), PRESETS)
def test_every_preset_builds_on_the_meta_device_at_seq_len_2048(family: str, size: str) -> None:
    with torch.device("meta"):
        model = build_model(f"{family}:{size}", 50_368, 2048)

    dims = FAMILIES[family].sizes[size]
    assert count_params(body_parameters(model)) == expected_body(family, dims)
    assert count_params(embedding_parameters(model)) == 50_368 * dims.hidden_size
    learned = FAMILIES[family].positions is not None
    assert count_params(position_parameters(model)) == (2048 * dims.hidden_size if learned else 0)
    low, high = BODY_RANGES.get(size, (0, 10e6))
    assert low <= count_params(body_parameters(model)) <= high


def test_paper_shapes_and_llama_swiglu_widths() -> None:
    shapes = {k: (s.hidden_size, s.num_layers, s.num_heads) for k, s in SIZES.items()}
    assert shapes["125m"] == (768, 12, 12)
    assert shapes["350m"] == (1024, 24, 16)
    assert shapes["1.3b"] == (2048, 24, 16)
    # 8/3 x C rounded up to a multiple of 256, as in Llama's reference code
    assert [swiglu_width(c) for c in (768, 1024, 2048)] == [2048, 2816, 5632]
    assert [SIZES[k].intermediate_size for k in ("125m", "350m", "1.3b")] == [2048, 2816, 5632]


def layer_calls_and_grads(
    model_name: str, checkpointing: bool
) -> tuple[int, dict[str, torch.Tensor | None]]:
    """One training forward/backward: how often layer 0's MLP ran, and every gradient."""
    model = build_model(model_name, 300, 32, seed=4, activation_checkpointing=checkpointing)
    model.train()
    first_layer = "transformer.h.0" if model_name.startswith("gpt2") else "model.layers.0"
    calls = []  # a pre-hook: the recompute stops once it has what the backward needs
    model.get_submodule(f"{first_layer}.mlp").register_forward_pre_hook(lambda *_: calls.append(1))
    batch = torch.randint(0, 300, (3, 33), generator=torch.Generator().manual_seed(0))
    next_token_loss(model, batch).backward()
    return len(calls), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("model", MODELS)
def test_activation_checkpointing_recomputes_and_leaves_gradients_unchanged(model: str) -> None:
    plain_calls, plain = layer_calls_and_grads(model, checkpointing=False)
    checkpointed_calls, checkpointed = layer_calls_and_grads(model, checkpointing=True)

    assert (plain_calls, checkpointed_calls) == (1, 2), "the backward pass reruns each layer"
    for name, grad in plain.items():
        assert grad is not None, name
        torch.testing.assert_close(checkpointed[name], grad, rtol=0, atol=1e-7, msg=name)
