import pytest
import torch

from dept.model import (
    body_parameters,
    body_state,
    build_model,
    count_params,
    embedding_parameters,
    load_body,
)


@pytest.mark.parametrize("tie", [True, False])
def test_body_is_identical_for_any_vocabulary(tie: bool) -> None:
    small = body_state(build_model("debug", 300, 32, tie_embeddings=tie, seed=3))
    large = body_state(build_model("debug", 5000, 32, tie_embeddings=tie, seed=3))
    assert small.keys() == large.keys()
    for name in small:
        assert torch.equal(small[name], large[name]), name
    assert not any("embed" in n or "lm_head" in n for n in small)


def test_tied_and_untied_embeddings() -> None:
    tied = embedding_parameters(build_model("debug", 300, 32, tie_embeddings=True))
    untied = embedding_parameters(build_model("debug", 300, 32, tie_embeddings=False))
    assert list(tied) == ["input"] and list(untied) == ["input", "output"]
    assert tied["input"].shape == (300, 64)


def test_body_and_embeddings_partition_the_model() -> None:
    model = build_model("debug", 300, 32, tie_embeddings=False)
    total = sum(p.numel() for p in model.parameters())
    assert count_params(body_parameters(model)) + count_params(embedding_parameters(model)) == total


def test_load_body_checks_names_and_shapes() -> None:
    model = build_model("debug", 300, 32)
    state = body_state(build_model("debug", 300, 32, seed=9))
    load_body(model, state)
    assert all(torch.equal(body_state(model)[n], state[n]) for n in state)
    name = next(iter(state))
    with pytest.raises(KeyError):
        load_body(model, {k: v for k, v in state.items() if k != name})
    with pytest.raises(ValueError, match=name):
        load_body(model, {**state, name: torch.zeros(1)})
