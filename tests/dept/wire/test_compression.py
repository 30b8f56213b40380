"""Pseudo-gradient encodings: error bounds, layout, bytes, malformed payloads, error feedback."""

import pytest
import torch

from dept.wire.compression import (
    BLOCK,
    INDEX_SUFFIX,
    LEVELS,
    SCALE_SUFFIX,
    CompressionError,
    compress_with_feedback,
    decode,
    encode,
    payload_keys,
    topk_count,
)

SHAPES = {"w": (7, 37), "b": (BLOCK,), "odd": (BLOCK + 1,), "one": (1,)}
LOSSY = ["fp16", "int8", "int4", "int2", "ternary", "topk"]
QUANTISED = list(LEVELS)  # int8, int4, int2, ternary


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


@pytest.mark.parametrize("kind", QUANTISED)
def test_block_codes_are_within_half_a_scale_of_every_value(kind: str) -> None:
    tensors = _tensors()
    payload = encode(tensors, kind)
    assert payload.keys() == payload_keys(SHAPES, kind)
    decoded = decode(payload, SHAPES, kind)
    for name, shape in SHAPES.items():
        codes, scales = payload[name], payload[name + SCALE_SUFFIX]
        size = tensors[name].numel()
        if kind == "int8":
            assert codes.dtype == torch.int8 and codes.shape == shape
        else:  # packed: two int4, four int2 or five ternary codes a byte
            per_byte = {"int4": 2, "int2": 4, "ternary": 5}[kind]
            assert codes.dtype == torch.uint8 and codes.shape == (-(-size // per_byte),)
        assert scales.dtype == torch.float32 and scales.shape == (-(-size // BLOCK),)
        assert decoded[name].dtype == torch.float32 and decoded[name].shape == shape
        per_value = scales.repeat_interleave(BLOCK)[:size].view(shape)  # each value's scale
        error = (decoded[name] - tensors[name]).abs()
        assert (error <= per_value / 2 * (1 + 1e-6)).all(), name
        flat = tensors[name].reshape(-1)
        assert torch.isclose(scales[0], flat[:BLOCK].abs().max() / LEVELS[kind])


@pytest.mark.parametrize("kind", QUANTISED)
def test_every_level_survives_the_packing(kind: str) -> None:
    levels = LEVELS[kind]
    # every code -L..L over and over (2L + 1 is odd: each takes every place in a byte),
    # 255 values: the last byte is part padding
    value = torch.arange(-levels, levels + 1).repeat((BLOCK - 1) // (2 * levels + 1)).float()
    assert value.numel() == BLOCK - 1
    decoded = decode(encode({"x": value}, kind), {"x": (BLOCK - 1,)}, kind)["x"]
    assert torch.equal(decoded, value), "scale 1 exactly: every code decodes to itself"


def test_ternary_sends_int2s_codes_in_fewer_bytes() -> None:
    tensors = _tensors()
    int2, ternary = encode(tensors, "int2"), encode(tensors, "ternary")
    assert all(torch.equal(int2[n + SCALE_SUFFIX], ternary[n + SCALE_SUFFIX]) for n in SHAPES)
    assert all(ternary[n].numel() < int2[n].numel() for n in SHAPES if n != "one")
    decoded = decode(int2, SHAPES, "int2"), decode(ternary, SHAPES, "ternary")
    assert all(torch.equal(decoded[0][n], decoded[1][n]) for n in SHAPES)


@pytest.mark.parametrize("kind", QUANTISED)
def test_zero_blocks_decode_to_exact_zeros(kind: str) -> None:
    value = torch.zeros(3 * BLOCK + 5)
    value[BLOCK + 3] = -LEVELS[kind] / 256  # one non-zero block; its scale 1/256 exactly
    payload = encode({"x": value}, kind)
    assert payload["x" + SCALE_SUFFIX].tolist() == [0.0, 1 / 256, 0.0, 0.0]
    decoded = decode(payload, {"x": tuple(value.shape)}, kind)["x"]
    assert torch.equal(decoded, value), "zeros stay zeros, the block's maximum is exact"


def test_topk_sends_the_largest_values_at_their_places() -> None:
    tensors = _tensors()
    payload = encode(tensors, "topk", density=0.1)
    assert payload.keys() == payload_keys(SHAPES, "topk")
    decoded = decode(payload, SHAPES, "topk", density=0.1)
    for name, shape in SHAPES.items():
        value, size = tensors[name], tensors[name].numel()
        k = topk_count(size, 0.1)
        assert k == max(1, -(-size // 10))
        values, indices = payload[name], payload[name + INDEX_SUFFIX]
        assert values.dtype == torch.float16 and values.shape == (k,)
        assert indices.dtype == torch.int32 and indices.shape == (k,)
        assert (indices.diff() > 0).all(), "ascending, no duplicates"
        kept = decoded[name] != 0
        assert kept.sum() == k and decoded[name].shape == shape
        smallest_kept = value[kept].abs().min()
        assert (value[~kept].abs() <= smallest_kept).all(), name
        assert torch.allclose(decoded[name][kept], value[kept], rtol=2**-11, atol=0)


@pytest.mark.parametrize(
    ("kind", "density", "bytes_"),
    [
        ("none", 1.0, 4096),
        ("fp16", 1.0, 2048),
        ("int8", 1.0, 1024 + 4 * 4),  # a code a value, a float32 scale per block of 256
        ("int4", 1.0, 512 + 4 * 4),
        ("int2", 1.0, 256 + 4 * 4),
        ("ternary", 1.0, 205 + 4 * 4),  # ceil(1024 / 5) bytes
        ("topk", 0.1, 103 * (2 + 4)),  # ceil(102.4) float16 values + int32 indices
        ("topk", 0.01, 11 * (2 + 4)),
    ],
)
def test_bytes_per_1024_float32_values(kind: str, density: float, bytes_: int) -> None:
    value = {"x": torch.randn(1024)}
    payload = encode(value, kind, density)
    assert sum(v.numel() * v.element_size() for v in payload.values()) == bytes_


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
        ("int8", lambda p: p["w"].__setitem__((0, 0), -128), r"codes outside \[-127, 127\]"),
        ("int4", lambda p: p["b"].__setitem__(3, 0xF7), r"codes outside \[-7, 7\]"),
        ("int4", lambda p: p.update(odd=p["odd"][:-1]), r"'odd' has shape \(128,\)"),
        ("int4", lambda p: p.update(w=p["w"].to(torch.int8)), "int8, expected uint8"),
        ("int4", lambda p: p["w" + SCALE_SUFFIX].__setitem__(0, float("nan")), "finite scales"),
        ("int2", lambda p: p["b"].__setitem__(0, 0b11_01_01_01), r"codes outside \[-1, 1\]"),
        ("int2", lambda p: p.update(b=torch.cat([p["b"], p["b"][:1]])), r"shape \(65,\)"),
        ("ternary", lambda p: p["b"].__setitem__(0, 255), "a byte >= 243, not 5 base-3 codes"),
        ("ternary", lambda p: p.update(b=p["b"][:-1]), r"'b' has shape \(51,\)"),
        ("topk", lambda p: p["w" + INDEX_SUFFIX].__setitem__(-1, 7 * 37), r"outside \[0, 259\)"),
        ("topk", lambda p: p["w" + INDEX_SUFFIX].__setitem__(0, -1), "indices outside"),
        ("topk", lambda p: _repeat_first_index(p, "w"), "without duplicates"),
        (
            "topk",
            lambda p: p["w" + INDEX_SUFFIX].__setitem__(slice(None), p["w" + INDEX_SUFFIX].flip(0)),
            "ascending",
        ),
        ("topk", lambda p: p.update(b=p["b"][:-1]), r"'b' has shape \(2,\), expected \(3,\)"),
        ("topk", lambda p: p.update(b=p["b"].float()), "float32, expected float16"),
        (
            "topk",
            lambda p: p.update(w=p["w"], **{"w@index": p["w@index"].long()}),
            "expected int32",
        ),
        ("topk", lambda p: p.pop("one" + INDEX_SUFFIX), "'one@index' is missing"),
        ("topk", lambda p: p["one"].__setitem__(0, float("nan")), "'one' holds NaN"),
        ("fp16", lambda p: p["w"].__setitem__((0, 0), float("inf")), "'w' holds NaN"),
        ("fp16", lambda p: p.update(w=p["w"].float()), "expected float16"),
        ("none", lambda p: p["b"].__setitem__(0, float("nan")), "'b' holds NaN"),
    ],
)
def test_malformed_payloads_are_refused_naming_the_array(kind, break_it, reason) -> None:
    payload = encode(_tensors(), kind, density=0.01)  # topk: 3 values of w, 3 of b, 1 of one
    break_it(payload)
    with pytest.raises(CompressionError, match=reason):
        decode(payload, SHAPES, kind, density=0.01)


def _repeat_first_index(payload: dict[str, torch.Tensor], name: str) -> None:
    indices = payload[name + INDEX_SUFFIX]
    indices[1] = indices[0]


@pytest.mark.parametrize("kind", LOSSY)
def test_a_non_finite_update_is_not_sent(kind: str) -> None:
    tensors = {**_tensors(), "b": torch.full((BLOCK,), float("nan"))}
    with pytest.raises(ValueError, match="'b' holds NaN"):
        encode(tensors, kind)


@pytest.mark.parametrize("kind", ["fp16", "topk"])
def test_values_beyond_float16_are_not_sent(kind: str) -> None:
    with pytest.raises(ValueError, match="float16 range"):
        encode({"big": torch.full((2,), 1e6)}, kind)


@pytest.mark.parametrize("kind", LOSSY)
def test_error_feedback_loses_nothing_over_the_rounds(kind: str) -> None:
    residual: dict[str, torch.Tensor] = {}
    sent = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    true = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    for round_ in range(6):
        delta = _tensors(seed=round_, scale=10.0 ** -(round_ % 4 + 2))  # 1e-2 .. 1e-5
        payload, residual = compress_with_feedback(delta, residual, kind, density=0.1)
        for name, value in decode(payload, SHAPES, kind, density=0.1).items():
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


@pytest.mark.parametrize(
    ("kind", "density", "bound"),
    [
        ("fp16", 0.01, 0.01),
        ("int8", 0.01, 0.01),
        ("int4", 0.01, 0.2),
        ("int2", 0.01, 1.0),
        ("ternary", 0.01, 1.0),
        ("topk", 0.1, 1 / 0.1),
        ("topk", 0.01, 1 / 0.01),
    ],
)
def test_error_feedback_tracks_a_fixed_update_with_a_bounded_residual(
    kind: str, density: float, bound: float
) -> None:
    # Prepare: the same Δ every round, as a source far from convergence sends
    delta = _tensors(seed=1)
    residual: dict[str, torch.Tensor] = {}
    sent = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    largest: list[float] = []  # max |residual| / max |Δ| over the tensors, per round
    # Execute
    rounds = 400
    for _ in range(rounds):
        payload, residual = compress_with_feedback(delta, residual, kind, density=density)
        for name, value in decode(payload, SHAPES, kind, density).items():
            sent[name] += value.double()
        largest.append(max(float(residual[n].abs().max() / delta[n].abs().max()) for n in SHAPES))
    # Assert: the residual stops growing (at most ~ 1/density rounds of one value wait
    # for top-k), so Σ decoded = rounds · Δ − residual is off by that bound only
    assert max(largest) <= bound
    assert max(largest[rounds // 2 :]) <= 1.2 * max(largest[: rounds // 2]) + 1e-6
    for name in SHAPES:
        error = (sent[name] / rounds - delta[name].double()).abs().max()
        assert error <= bound / rounds * float(delta[name].abs().max()) * 1.01, name


@pytest.mark.parametrize("kind", LOSSY)
def test_no_value_sent_exceeds_the_limit_and_the_excess_waits_in_the_residual(kind: str) -> None:
    # A residual left by a round of large learning rates, then a round of small ones.
    delta = {"w": torch.full((300,), 1e-4)}
    residual = {"w": torch.linspace(-3e-3, 3e-3, 300)}
    payload, kept = compress_with_feedback(delta, residual, kind, limit=5e-4, density=0.5)
    sent = decode(payload, {"w": (300,)}, kind, density=0.5)["w"]
    assert float(sent.abs().max()) <= 5e-4 * (1 + 2**-10)
    assert torch.allclose(sent + kept["w"], delta["w"] + residual["w"], atol=1e-9)
