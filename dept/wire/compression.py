"""Pseudo-gradient compression for the trip from client to server.

Only Δ going up is compressed; θ going down stays float32, since every client starts its
round from it and an error there would not be fed back anywhere.

- ``none``: float32, as computed.
- ``fp16``: a cast; half the bytes, relative error ≤ 2^-11 in fp16's normal range.
- ``int8``, ``int4``, ``int2``, ``ternary``: each tensor, flattened, is cut into blocks of
  ``BLOCK`` values; a block travels as codes q = round(x / s) in [-L, L] with one float32
  scale s = max|x| / L (L = 127, 7, 1, 1), so no value is off by more than s / 2 and the
  block's largest is exact. int8 codes are int8 shaped like the tensor; the others are
  offset to q + L and packed into uint8 bytes (1-D) as the digits of a number in base 2L + 1
  rounded up to a power of two (int4: two a byte, int2: four), or in base 3 (ternary: five
  a byte, 3^5 = 243 ≤ 256, 1.6 bits a code). Per 1024 float32 values (4096 bytes): 1040,
  528, 272 and 221 bytes, about 3.9x, 7.8x, 15x and 18.5x fewer. int2 and ternary send the
  same codes q in {-1, 0, 1} (symmetric with an exact zero, so a zero or tiny value costs no
  error) and decode to the same values; int2 wastes its fourth code (3), ternary packs
  tighter. The receiver refuses an int2 code 3 and a ternary byte of 243 or more.
- ``topk``: per tensor, the k = ceil(density · n) values largest in magnitude, as float16,
  and their flat indices (int32, ascending). 6 bytes per value kept: at density 0.01 about
  67x fewer bytes. Per tensor, not per block: the largest values of a layer cluster, and
  per tensor keeps the ones that matter wherever they are.

Codes keep the tensor's name; a quantised tensor's block scales travel beside it as
``<name>@scale``, a top-k tensor's indices as ``<name>@index``. Every lossy kind pairs with
error feedback (Seide et al. 2014, Karimireddy et al. 2019): the client adds what a message
lost to its next update, so over the rounds nothing is lost, only delayed
(:func:`compress_with_feedback`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

BLOCK = 256
SCALE_SUFFIX = "@scale"
INDEX_SUFFIX = "@index"
TOPK_DENSITY = 0.01  # the run config's default ``topk-density``
INT8_MAX = 127
LEVELS = {"int8": INT8_MAX, "int4": 7, "int2": 1, "ternary": 1}  # codes in [-L, L]
PACKING = {"int4": (16, 2), "int2": (4, 4), "ternary": (3, 5)}  # (base, codes a uint8 byte)


class CompressionError(ValueError):
    """A payload does not decode to the tensors expected; the message names the array."""


def payload_keys(names: Mapping[str, object] | set[str], kind: str) -> set[str]:
    """The array names a payload of tensors ``names`` has under compression ``kind``."""
    keys = set(names)
    suffix = SCALE_SUFFIX if kind in LEVELS else INDEX_SUFFIX if kind == "topk" else None
    return keys | {n + suffix for n in keys} if suffix else keys


def topk_count(numel: int, density: float) -> int:
    """How many of a tensor's ``numel`` values top-k sends: at least one."""
    return min(numel, max(1, math.ceil(density * numel)))


def encode(
    tensors: Mapping[str, torch.Tensor], kind: str, density: float = TOPK_DENSITY
) -> dict[str, torch.Tensor]:
    """float32 tensors -> the arrays that travel (``density``: top-k's share of values
    kept). Refuses a non-finite tensor (which no receiver would accept) with a ValueError
    naming it."""
    if kind == "none":
        return dict(tensors)
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if not torch.isfinite(value).all():
            raise ValueError(f"'{name}' holds NaN or infinite values; it cannot be sent")
        if kind == "fp16":
            out[name] = _float16(name, value)
        elif kind in LEVELS:
            out[name], out[name + SCALE_SUFFIX] = _quantise(value, kind)
        elif kind == "topk":
            out[name], out[name + INDEX_SUFFIX] = _topk(name, value, density)
        else:
            raise ValueError(f"unknown compression {kind!r}")
    return out


def decode(
    arrays: Mapping[str, torch.Tensor],
    shapes: Mapping[str, tuple[int, ...]],
    kind: str,
    density: float = TOPK_DENSITY,
) -> dict[str, torch.Tensor]:
    """The arrays that travelled -> float32 tensors of ``shapes``, or
    :class:`CompressionError` (missing array, wrong dtype or length, bad scale, code or
    index, NaN)."""
    views = {name: value.detach().cpu().numpy() for name, value in arrays.items()}
    return {
        name: torch.from_numpy(decode_array(views, name, shape, kind, density))
        for name, shape in shapes.items()
    }


def decode_array(
    arrays: Mapping[str, np.ndarray],
    name: str,
    shape: tuple[int, ...],
    kind: str,
    density: float = TOPK_DENSITY,
) -> np.ndarray:
    """One tensor of a payload, decoded to float32, or :class:`CompressionError`.

    One at a time and in NumPy so the server never holds a whole decoded reply: for
    ``none`` the result is ``arrays[name]`` itself (a read-only view of the message's bytes
    works), the lossy kinds allocate this tensor only."""
    if kind == "none":
        value = _expect(arrays, name, np.dtype(np.float32), shape)
    elif kind == "fp16":
        value = _expect(arrays, name, np.dtype(np.float16), shape).astype(np.float32)
    elif kind in LEVELS:
        value = _dequantise(arrays, name, shape, kind)
    elif kind == "topk":
        value = _topk_decode(arrays, name, shape, density)
    else:
        raise ValueError(f"unknown compression {kind!r}")
    if not np.isfinite(value).all():
        raise CompressionError(f"'{name}' holds NaN or infinite values")
    return value


def compress_with_feedback(
    delta: Mapping[str, torch.Tensor],
    residual: Mapping[str, torch.Tensor],
    kind: str,
    limit: float | Mapping[str, float] | None = None,
    density: float = TOPK_DENSITY,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(payload for Δ + ``residual``, the new residual: what that payload loses).

    ``residual`` is the previous round's (empty before the first). Over rounds the decoded
    payloads sum to the true Δs minus the last residual. ``limit``: no value sent exceeds it
    (the server's reach for this round, or per tensor name, a fragment's over its span: a
    residual from a round of larger learning rates must not make an honest update look
    impossible); the excess stays in the residual.
    """
    if residual and (
        residual.keys() != delta.keys()
        or any(residual[n].shape != v.shape for n, v in delta.items())
    ):
        raise ValueError("the saved residual does not match the update's tensors or shapes")
    target = {n: v + residual[n] if residual else v for n, v in delta.items()}
    limits = limit if isinstance(limit, Mapping) else dict.fromkeys(target, limit)
    sent = {n: _clamp(v, limits[n]) for n, v in target.items()}
    payload = encode(sent, kind, density)
    received = decode(payload, {n: tuple(v.shape) for n, v in target.items()}, kind, density)
    return payload, {n: target[n] - received[n] for n in target}


def _clamp(value: torch.Tensor, limit: float | None) -> torch.Tensor:
    return value.clamp(-limit, limit) if limit else value


def _float16(name: str, value: torch.Tensor) -> torch.Tensor:
    half = value.to(torch.float16)
    if not torch.isfinite(half).all():
        raise ValueError(f"'{name}' exceeds the float16 range; use compression int8")
    return half


def _quantise(value: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, float32 scale per block): int8 codes shaped like ``value``, or the codes
    + L packed into uint8 bytes (int4, int2, ternary)."""
    levels = LEVELS[kind]
    blocks = F.pad(value.detach().reshape(-1).float(), (0, -value.numel() % BLOCK))
    blocks = blocks.view(-1, BLOCK)  # (num_blocks, BLOCK), the last one zero-padded
    scales = blocks.abs().amax(dim=1) / levels  # (num_blocks,)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero block: codes 0
    codes = torch.round(blocks / safe[:, None]).clamp_(-levels, levels).to(torch.int8)
    flat = codes.reshape(-1)[: value.numel()]
    if kind == "int8":
        return flat.view(value.shape), scales
    return _pack((flat + levels).to(torch.uint8), *PACKING[kind]), scales


def _pack(codes: torch.Tensor, base: int, per_byte: int) -> torch.Tensor:
    """Codes < ``base``, ``per_byte`` to a byte as its base-``base`` digits, the first the
    lowest: (ceil(n / per_byte),). For a power-of-two base, the first code in the low bits."""
    padded = F.pad(codes, (0, -codes.numel() % per_byte)).view(-1, per_byte).to(torch.int32)
    places = base ** torch.arange(per_byte, dtype=torch.int32)
    return (padded * places).sum(dim=1).to(torch.uint8)


def _unpack(packed: np.ndarray, base: int, per_byte: int) -> np.ndarray:
    """Every code the bytes hold, padding included: (bytes · per_byte,) uint8."""
    places = base ** np.arange(per_byte, dtype=np.int32)
    return (packed[:, None].astype(np.int32) // places % base).astype(np.uint8).reshape(-1)


def _dequantise(
    arrays: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...], kind: str
) -> np.ndarray:
    levels, size = LEVELS[kind], math.prod(shape)
    if kind == "int8":
        codes = _expect(arrays, name, np.dtype(np.int8), shape).reshape(-1)
    else:
        base, per_byte = PACKING[kind]
        packed = _expect(arrays, name, np.dtype(np.uint8), (-(-size // per_byte),))
        limit = base**per_byte  # below 256 only for ternary (243): a byte can exceed it
        if limit < 256 and packed.size and int(packed.max()) >= limit:
            raise CompressionError(
                f"'{name}' holds a byte >= {limit}, not {per_byte} base-{base} codes"
            )
        codes = _unpack(packed, base, per_byte).astype(np.int8) - np.int8(levels)
    if codes.size and (codes.min() < -levels or codes.max() > levels):
        raise CompressionError(f"'{name}' holds codes outside [-{levels}, {levels}]")
    num_blocks = -(-size // BLOCK)
    scales = _expect(arrays, name + SCALE_SUFFIX, np.dtype(np.float32), (num_blocks,))
    if not (np.isfinite(scales) & (scales >= 0)).all():
        raise CompressionError(f"'{name}{SCALE_SUFFIX}' must hold finite scales >= 0")
    blocks = np.zeros((num_blocks, BLOCK), np.float32)  # the last block zero-padded
    blocks.reshape(-1)[:size] = codes[:size]
    with np.errstate(over="ignore"):  # a scale near the float32 limit: inf, refused below
        blocks *= scales[:, None]
    return blocks.reshape(-1)[:size].reshape(shape)


def _topk(name: str, value: torch.Tensor, density: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(float16 values, int32 flat indices, ascending) of the largest |value|s."""
    flat = value.detach().reshape(-1).float()
    picked = torch.topk(flat.abs(), topk_count(flat.numel(), density), sorted=False).indices
    indices = picked.sort().values
    return _float16(name, flat[indices]), indices.to(torch.int32)


def _topk_decode(
    arrays: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...], density: float
) -> np.ndarray:
    size = math.prod(shape)
    count = (topk_count(size, density),)
    values = _expect(arrays, name, np.dtype(np.float16), count)
    indices = _expect(arrays, name + INDEX_SUFFIX, np.dtype(np.int32), count)
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        raise CompressionError(f"'{name}{INDEX_SUFFIX}' holds indices outside [0, {size})")
    if not (np.diff(indices) > 0).all():
        raise CompressionError(f"'{name}{INDEX_SUFFIX}' must be ascending, without duplicates")
    out = np.zeros(size, np.float32)
    out[indices] = values
    return out.reshape(shape)


def _expect(
    arrays: Mapping[str, np.ndarray], name: str, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    value = arrays.get(name)
    if value is None:
        raise CompressionError(f"'{name}' is missing")
    if value.dtype != dtype:
        raise CompressionError(f"'{name}' has dtype {value.dtype}, expected {dtype}")
    if tuple(value.shape) != tuple(shape):
        raise CompressionError(f"'{name}' has shape {tuple(value.shape)}, expected {tuple(shape)}")
    return value
