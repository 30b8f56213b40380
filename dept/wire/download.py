"""The body going down in a codec (``download-compression``): the change since the body a
node holds, not the body.

The server keeps θ̂, the body it last sent: what every node that trained in that round
holds, bit for bit. A node holding θ̂ gets Q(θ − θ̂), coded as an upload is
(:mod:`dept.wire.compression`), and both sides compute θ̂' = θ̂ + Q⁻¹(Q(θ − θ̂)) with this
module's code, on the CPU, in float32: the same bits on every machine. What one round's
codes miss stays in θ − θ̂' and goes down in the next round's change, so the nodes trail θ by
one quantisation error, never more (error feedback, kept by the server for all of them).

Every message names the digest of the body the node is to train from (and of the one a
change applies to): a node whose own body is not that one fails no round, it asks for the
whole body (:data:`dept.wire.keys.NEEDS_BODY`), which the server then sends, in float32.
A node that missed a round, or has no body yet, is sent the whole body in the first place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import torch

from dept.wire.compression import decode, encode

KINDS = ("none", "fp16", "int8", "int4", "int2", "ternary")  # topk: a change is not sparse


def body_digest(body: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of the body's names, shapes and float32 bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(body):
        value = body[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}:{tuple(value.shape)};".encode())
        digest.update(value.numpy().reshape(-1).view(np.uint8).data)
    return digest.hexdigest()


def encode_change(
    body: Mapping[str, torch.Tensor], held: Mapping[str, torch.Tensor], kind: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the arrays that carry ``body`` − ``held`` under ``kind``, the body a node holding
    ``held`` makes of them: :func:`apply_change`)."""
    change = {n: body[n].float() - held[n] for n in held}
    codes = encode(change, kind)
    return codes, apply_change(held, codes, kind)


def apply_change(
    held: Mapping[str, torch.Tensor], codes: Mapping[str, torch.Tensor], kind: str
) -> dict[str, torch.Tensor]:
    """``held`` plus the change ``codes`` carry (a :class:`CompressionError` names a code
    that does not decode to its tensor)."""
    shapes = {n: tuple(v.shape) for n, v in held.items()}
    change = decode(codes, shapes, kind)
    return {n: held[n].float() + change[n] for n in held}
