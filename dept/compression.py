"""Pseudo-gradient compression for the trip from client to server.

Only Δ going up is compressed; θ going down stays float32, since every client starts its
round from it and an error there would not be fed back anywhere.

- ``none``: float32, as computed.
- ``fp16``: a cast; half the bytes, relative error ≤ 2^-11 in fp16's normal range.
- ``int8``: each tensor, flattened, is cut into blocks of ``BLOCK`` values; a block travels as
  int8 codes round(x / s) with one float32 scale s = max|x| / 127, so no value is off by more
  than s / 2. 260 bytes per 1024 of float32: about 3.9x fewer.

Codes keep the tensor's name and shape; an int8 tensor's block scales travel beside it as
``<name>@scale``. Both lossy kinds pair with error feedback (Seide et al. 2014, Karimireddy
et al. 2019): the client adds what a message lost to its next update, so over the rounds
nothing is lost, only delayed (:func:`compress_with_feedback`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

BLOCK = 256
SCALE_SUFFIX = "@scale"
INT8_MAX = 127


class CompressionError(ValueError):
    """A payload does not decode to the tensors expected; the message names the array."""


def payload_keys(names: Mapping[str, object] | set[str], kind: str) -> set[str]:
    """The array names a payload of tensors ``names`` has under compression ``kind``."""
    keys = set(names)
    return keys | {n + SCALE_SUFFIX for n in keys} if kind == "int8" else keys


def encode(tensors: Mapping[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """float32 tensors -> the arrays that travel. Refuses a non-finite tensor (which no
    receiver would accept) with a ValueError naming it."""
    if kind == "none":
        return dict(tensors)
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if not torch.isfinite(value).all():
            raise ValueError(f"'{name}' holds NaN or infinite values; it cannot be sent")
        if kind == "fp16":
            out[name] = value.to(torch.float16)
            if not torch.isfinite(out[name]).all():
                raise ValueError(f"'{name}' exceeds the float16 range; use compression int8")
        elif kind == "int8":
            out[name], out[name + SCALE_SUFFIX] = _int8_blocks(value)
        else:
            raise ValueError(f"unknown compression {kind!r}")
    return out


def decode(
    arrays: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]], kind: str
) -> dict[str, torch.Tensor]:
    """The arrays that travelled -> float32 tensors of ``shapes``, or
    :class:`CompressionError` (missing array or scale, wrong dtype or shape, NaN)."""
    views = {name: value.detach().cpu().numpy() for name, value in arrays.items()}
    return {
        name: torch.from_numpy(decode_array(views, name, shape, kind))
        for name, shape in shapes.items()
    }


def decode_array(
    arrays: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...], kind: str
) -> np.ndarray:
    """One tensor of a payload, decoded to float32, or :class:`CompressionError`.

    One at a time and in NumPy so the server never holds a whole decoded reply: for
    ``none`` the result is ``arrays[name]`` itself (a read-only view of the message's bytes
    works), the lossy kinds allocate this tensor only."""
    if kind == "none":
        value = _expect(arrays, name, np.dtype(np.float32), shape)
    elif kind == "fp16":
        value = _expect(arrays, name, np.dtype(np.float16), shape).astype(np.float32)
    elif kind == "int8":
        value = _int8_decode(arrays, name, shape)
    else:
        raise ValueError(f"unknown compression {kind!r}")
    if not np.isfinite(value).all():
        raise CompressionError(f"'{name}' holds NaN or infinite values")
    return value


def compress_with_feedback(
    delta: Mapping[str, torch.Tensor],
    residual: Mapping[str, torch.Tensor],
    kind: str,
    limit: float | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(payload for Δ + ``residual``, the new residual: what that payload loses).

    ``residual`` is the previous round's (empty before the first). Over rounds the decoded
    payloads sum to the true Δs minus the last residual. ``limit``: no value sent exceeds it
    (the server's reach for this round: a residual from a round of larger learning rates
    must not make an honest update look impossible); the excess stays in the residual.
    """
    if residual and (
        residual.keys() != delta.keys()
        or any(residual[n].shape != v.shape for n, v in delta.items())
    ):
        raise ValueError("the saved residual does not match the update's tensors or shapes")
    target = {n: v + residual[n] if residual else v for n, v in delta.items()}
    sent = {n: v.clamp(-limit, limit) for n, v in target.items()} if limit else target
    payload = encode(sent, kind)
    received = decode(payload, {n: tuple(v.shape) for n, v in target.items()}, kind)
    return payload, {n: target[n] - received[n] for n in target}


def _blocks(flat: torch.Tensor) -> torch.Tensor:
    """A flat tensor zero-padded to whole blocks: (num_blocks, BLOCK)."""
    return F.pad(flat, (0, -flat.numel() % BLOCK)).view(-1, BLOCK)


def _int8_blocks(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes shaped like ``value``, float32 scale per block)."""
    blocks = _blocks(value.detach().reshape(-1).float())  # (num_blocks, BLOCK)
    scales = blocks.abs().amax(dim=1) / INT8_MAX  # (num_blocks,)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero block: codes 0
    codes = torch.round(blocks / safe[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes.reshape(-1)[: value.numel()].view(value.shape), scales


def _int8_decode(arrays: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    codes = _expect(arrays, name, np.dtype(np.int8), shape)
    num_blocks = -(-codes.size // BLOCK)
    scales = _expect(arrays, name + SCALE_SUFFIX, np.dtype(np.float32), (num_blocks,))
    if not (np.isfinite(scales) & (scales >= 0)).all():
        raise CompressionError(f"'{name}{SCALE_SUFFIX}' must hold finite scales >= 0")
    blocks = np.zeros((num_blocks, BLOCK), np.float32)  # the last block zero-padded
    blocks.reshape(-1)[: codes.size] = codes.reshape(-1)
    with np.errstate(over="ignore"):  # a scale near the float32 limit: inf, refused below
        blocks *= scales[:, None]
    return blocks.reshape(-1)[: codes.size].reshape(shape)


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
