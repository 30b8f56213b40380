"""Pseudo-gradient encodings: error bounds, layout, malformed payloads, error feedback."""

import pytest
import torch

from dept.compression import (
    BLOCK,
    SCALE_SUFFIX,
    CompressionError,
    compress_with_feedback,
    decode,
    encode,
    payload_keys,
)

SHAPES = {"w": (7, 37), "b": (BLOCK,), "odd": (BLOCK + 1,), "one": (1,)}


def _tensors(seed: int = 0, scale: float = 1e-2) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen) * scale for n, s in SHAPES.items()}


def test_fp16_halves_the_bytes_within_fp16_precision() -> None:
    tensors = _tensors()
    payload = encode(tensors, "fp16")
    assert payload.keys() == payload_keys(SHAPES, "fp16") == set(SHAPES)
    assert all(
        payload[n].dtype == torch.float16 and payload[n].shape == s for n, s in SHAPES.items()
    )
    decoded = decode(payload, SHAPES, "fp16")
    for name, value in tensors.items():
        assert decoded[name].dtype == torch.float32
        normal = value.abs() > torch.finfo(torch.float16).tiny
        error = (decoded[name] - value).abs()[normal] / value.abs()[normal]
        assert error.max() <= 2**-11, name


def test_int8_codes_are_within_half_a_scale_of_every_value() -> None:
    tensors = _tensors()
    payload = encode(tensors, "int8")
    assert payload.keys() == payload_keys(SHAPES, "int8")
    decoded = decode(payload, SHAPES, "int8")
    for name, shape in SHAPES.items():
        codes, scales = payload[name], payload[name + SCALE_SUFFIX]
        assert codes.dtype == torch.int8 and codes.shape == shape
        size = tensors[name].numel()
        assert scales.dtype == torch.float32 and scales.shape == (-(-size // BLOCK),)
        assert decoded[name].dtype == torch.float32 and decoded[name].shape == shape
        per_value = scales.repeat_interleave(BLOCK)[:size].view(shape)  # each value's scale
        error = (decoded[name] - tensors[name]).abs()
        assert (error <= per_value / 2 * (1 + 1e-6)).all(), name
        flat = tensors[name].reshape(-1)
        assert torch.isclose(scales[0], flat[:BLOCK].abs().max() / 127)


def test_int8_zero_blocks_decode_to_exact_zeros() -> None:
    value = torch.zeros(3 * BLOCK + 5)
    value[BLOCK + 3] = -127 / 256  # one non-zero block among zero ones; scale 1/256 exactly
    payload = encode({"x": value}, "int8")
    assert payload["x" + SCALE_SUFFIX].tolist() == [0.0, 1 / 256, 0.0, 0.0]
    decoded = decode(payload, {"x": tuple(value.shape)}, "int8")["x"]
    assert torch.equal(decoded, value), "zeros stay zeros, the block's maximum is exact"


def test_none_passes_float32_through() -> None:
    tensors = _tensors()
    assert all(encode(tensors, "none")[n] is v for n, v in tensors.items())
    decoded = decode(tensors, SHAPES, "none")
    assert all(torch.equal(decoded[n], v) for n, v in tensors.items())


@pytest.mark.parametrize(
    ("kind", "break_it", "reason"),
    [
        ("int8", lambda p: p.pop("w" + SCALE_SUFFIX), "'w@scale' is missing"),
        ("int8", lambda p: p.update(w=p["w"].float()), "'w' has dtype float32, expected int8"),
        ("int8", lambda p: p.update(b=p["b"][:-1]), r"'b' has shape \(255,\)"),
        ("int8", lambda p: p["odd" + SCALE_SUFFIX].__setitem__(1, float("nan")), "finite scales"),
        ("int8", lambda p: p["one" + SCALE_SUFFIX].__setitem__(0, -1.0), "scales >= 0"),
        ("int8", lambda p: p["one" + SCALE_SUFFIX].__setitem__(0, 1e38), "NaN or infinite"),
        ("fp16", lambda p: p["w"].__setitem__((0, 0), float("inf")), "'w' holds NaN"),
        ("fp16", lambda p: p.update(w=p["w"].float()), "expected float16"),
        ("none", lambda p: p["b"].__setitem__(0, float("nan")), "'b' holds NaN"),
    ],
)
def test_malformed_payloads_are_refused_naming_the_array(kind, break_it, reason) -> None:
    payload = encode(_tensors(), kind)
    break_it(payload)
    with pytest.raises(CompressionError, match=reason):
        decode(payload, SHAPES, kind)


def test_a_non_finite_update_is_not_sent() -> None:
    tensors = {**_tensors(), "b": torch.full((BLOCK,), float("nan"))}
    for kind in ("fp16", "int8"):
        with pytest.raises(ValueError, match="'b' holds NaN"):
            encode(tensors, kind)
    with pytest.raises(ValueError, match="float16 range"):
        encode({"big": torch.full((2,), 1e6)}, "fp16")


@pytest.mark.parametrize("kind", ["fp16", "int8"])
def test_error_feedback_loses_nothing_over_the_rounds(kind: str) -> None:
    residual: dict[str, torch.Tensor] = {}
    sent = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    true = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    for round_ in range(6):
        delta = _tensors(seed=round_, scale=10.0 ** -(round_ % 4 + 2))  # 1e-2 .. 1e-5
        payload, residual = compress_with_feedback(delta, residual, kind)
        for name, value in decode(payload, SHAPES, kind).items():
            sent[name] += value.double()
            true[name] += delta[name].double()
    for name in SHAPES:
        # Σ decoded messages = Σ true deltas − the last residual, up to float32 rounding
        assert torch.allclose(sent[name], true[name] - residual[name].double(), atol=1e-8), name
    assert residual["w"].abs().max() > 0, "the last message did lose something"


def test_a_residual_of_other_tensors_is_refused() -> None:
    delta = _tensors()
    with pytest.raises(ValueError, match="residual does not match"):
        compress_with_feedback(delta, {"w": torch.zeros(3)}, "int8")


@pytest.mark.parametrize("kind", ["int8", "fp16"])
def test_no_value_sent_exceeds_the_limit_and_the_excess_waits_in_the_residual(kind: str) -> None:
    # A residual left by a round of large learning rates, then a round of small ones.
    delta = {"w": torch.full((300,), 1e-4)}
    residual = {"w": torch.linspace(-3e-3, 3e-3, 300)}
    payload, kept = compress_with_feedback(delta, residual, kind, limit=5e-4)
    sent = decode(payload, {"w": (300,)}, kind)["w"]
    assert float(sent.abs().max()) <= 5e-4 * (1 + 2**-10)
    assert torch.allclose(sent + kept["w"], delta["w"] + residual["w"], atol=1e-9)
