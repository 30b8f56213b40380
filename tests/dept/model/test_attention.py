"""Attention leaves causality to SDPA's ``is_causal`` (so its flash kernel can run) where
that is exact, compiled or not, and gives the same numbers as Transformers' own SDPA."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from unittest import mock

import pytest
import torch

from dept.model.attention import CAUSAL_SDPA
from dept.model.build import build_model

VOCAB, WINDOW = 300, 16


@pytest.fixture
def sdpa_calls() -> Iterator[list[dict]]:
    """Each SDPA call's mask and ``is_causal``, as the model made it."""
    calls: list[dict] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append({"mask": kwargs.get("attn_mask"), "is_causal": kwargs.get("is_causal")})
        return real(*args, **kwargs)  # type: ignore[arg-type]

    with mock.patch("torch.nn.functional.scaled_dot_product_attention", spy):
        yield calls


@pytest.mark.parametrize("model", ["llama:debug", "gpt2:debug"])
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_packed_windows_reach_sdpa_with_no_mask_tensor(
    model: str, compiled: bool, sdpa_calls: list[dict]
) -> None:
    net = build_model(model, VOCAB, WINDOW)
    forward = torch.compile(net, backend="eager", fullgraph=False) if compiled else net

    forward(torch.randint(0, VOCAB, (2, WINDOW)))

    assert net.config._attn_implementation == CAUSAL_SDPA
    assert sdpa_calls, "the model called SDPA"
    assert all(c["mask"] is None and c["is_causal"] for c in sdpa_calls), sdpa_calls


@pytest.mark.parametrize("model", ["llama:debug", "gpt2:debug"])
def test_no_mask_tensor_also_where_transformers_would_build_one(
    model: str, sdpa_calls: list[dict]
) -> None:
    # torch < 2.14 under torch.compile: dynamo reads "exporting" as true, and Transformers'
    # own SDPA then builds the mask (flash ruled out; the device image's torch is older)
    ours = build_model(model, VOCAB, WINDOW)
    theirs = copy.deepcopy(ours)
    theirs.config._attn_implementation = "sdpa"
    ids = torch.randint(0, VOCAB, (2, WINDOW))

    with mock.patch("transformers.masking_utils.is_torchdynamo_exporting", return_value=True):
        ours(ids)
        mine, sdpa_calls[:] = list(sdpa_calls), []
        theirs(ids)

    assert mine and all(c["mask"] is None and c["is_causal"] for c in mine)
    assert sdpa_calls and all(c["mask"] is not None for c in sdpa_calls), "the case is real"


@pytest.mark.parametrize("model", ["llama:debug", "gpt2:debug"])
def test_the_logits_are_transformers_own_sdpas(model: str) -> None:
    ours = build_model(model, VOCAB, WINDOW).eval()
    theirs = copy.deepcopy(ours)
    theirs.config._attn_implementation = "sdpa"
    ids = torch.randint(0, VOCAB, (2, WINDOW))

    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits)


def test_padding_still_gets_transformers_mask(sdpa_calls: list[dict]) -> None:
    net = build_model("llama:debug", VOCAB, WINDOW).eval()
    padding = torch.ones(2, WINDOW, dtype=torch.long)
    padding[0, :4] = 0  # left padding in the first row

    with torch.no_grad():
        net(torch.randint(0, VOCAB, (2, WINDOW)), attention_mask=padding)

    assert sdpa_calls and all(c["mask"] is not None for c in sdpa_calls)
