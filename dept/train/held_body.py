"""A node's side of the download codec (:mod:`dept.wire.download`): the body the server last
sent it, kept between rounds, and the body a train message makes of it.

The body is kept in the source's state folder (``download-body.safetensors``, its digest in
the file's metadata, so a check reads no tensor) and, for the last source a process served,
in memory: a warm worker or a Ray actor serving one source does not read it back. Whatever
happened to it (a crash, a resumed attempt, another machine), the digests decide: a change
is applied only to the body it was made for, and the result must be the body the server
made, bit for bit; otherwise the node asks for the whole body rather than train on another.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dept.model.roles import EMBEDDING_NAMES
from dept.state.files import new_file_mode
from dept.wire import keys
from dept.wire.download import apply_change, body_digest

FILE = "download-body.safetensors"
DIGEST = "digest"
log = logging.getLogger(__name__)
_last: tuple[Path, str, dict[str, torch.Tensor]] | None = None  # (folder, digest, body)


class WrongBody(ValueError):
    """A whole body that is not the one its message names: damaged on the way."""


def received_body(
    folder: Path, arrays: Mapping[str, torch.Tensor], config: Mapping[str, Any], kind: str
) -> dict[str, torch.Tensor] | None:
    """What the source trains from (θ̂', with φ as sent), kept for the next round; None when
    the message carries a change to a body this node does not hold (ask for the whole)."""
    others = {n: v for n, v in arrays.items() if n in EMBEDDING_NAMES}
    sent = {n: v for n, v in arrays.items() if n not in EMBEDDING_NAMES}
    digest = str(config[keys.BODY_DIGEST])
    if keys.BASE_DIGEST in config:
        held = _held(folder, str(config[keys.BASE_DIGEST]))
        if held is None:
            return None
        body = apply_change(held, sent, kind)
        if body_digest(body) != digest:
            log.warning("%s: the change made another body than the server's", folder.name)
            return None
    else:
        body = {n: v.float() for n, v in sent.items()}
        if body_digest(body) != digest:
            raise WrongBody(f"the body received is not the one its message names ({digest})")
    _keep(folder, digest, body)
    return body | others


def _held(folder: Path, digest: str) -> dict[str, torch.Tensor] | None:
    """The body kept in ``folder`` if it is the one of ``digest``."""
    if _last is not None and _last[0] == folder:
        return _last[2] if _last[1] == digest else None
    path = folder / FILE
    if not path.is_file():
        return None
    with safe_open(str(path), "pt") as handle:
        if (handle.metadata() or {}).get(DIGEST) != digest:
            return None
    return load_file(str(path))


def _keep(folder: Path, digest: str, body: dict[str, torch.Tensor]) -> None:
    global _last
    _last = (folder, digest, body)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE
    save_file({n: v.contiguous() for n, v in body.items()}, str(path), {DIGEST: digest})
    path.chmod(new_file_mode(folder))
