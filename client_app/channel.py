"""The wire between a ClientApp and its node's warm worker (:mod:`client_app.worker`).

One frame each way per call: two 8-byte big-endian lengths, a JSON header (which lists
every blob's size), then the raw bytes of every array back to back. A Flower ``RecordDict``
crosses as it is: array records as each ``Array``'s dtype, shape, stype and data (NumPy's
own ``.npy`` bytes, read back with ``allow_pickle=False``), metric and config records as
JSON. Never pickle: a peer can make the other side run nothing but the task it names.

Each blob is received straight into the ``bytes`` object its ``Array`` keeps
(``MSG_WAITALL``): the ClientApp is a fresh process for every message, and it pays in page
faults for every body-sized buffer it touches first (a frame-sized buffer, then a copy cut
from it, would double that).

Light on purpose (stdlib and Flower only): the ClientApp that imports it must not pay for
torch, which is the whole point of the worker.
"""

from __future__ import annotations

import hmac
import io
import json
import socket
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.constant import SType
from numpy.lib import format as npy

LENGTHS = struct.Struct(">QQ")  # header bytes, body bytes
TIMEVAL = struct.Struct("@ll")  # struct timeval: seconds, microseconds
SIZES = "blob-sizes"  # the frame header's list of its blobs' sizes
MAX_HEADER = 64 * 2**20  # a header is config and metrics, never tensors
TRAIN, EVALUATE, QUERY = "train", "evaluate", "query"  # the tasks a call may name


class ChannelError(ConnectionError):
    """The peer hung up mid-frame or sent something that is not a frame."""


class RemoteError(RuntimeError):
    """The worker ran the task and it failed: ``what`` is ``"Type: message"`` as raised there."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def encode(content: RecordDict) -> tuple[dict[str, Any], list[bytes]]:
    """(the JSON-able description of ``content``, the array bytes in header order)."""
    arrays: dict[str, list[dict[str, Any]]] = {}
    blobs: list[bytes] = []
    for name, record in content.array_records.items():
        arrays[name] = []
        for key, array in record.items():
            meta = {"key": key, "dtype": array.dtype, "shape": list(array.shape)}
            arrays[name].append({**meta, "stype": array.stype, "size": len(array.data)})
            blobs.append(array.data)
    header = {
        "arrays": arrays,
        "metrics": {n: dict(r) for n, r in content.metric_records.items()},
        "configs": {n: dict(r) for n, r in content.config_records.items()},
    }
    return header, blobs


def npy_array(values: np.ndarray) -> Array:
    """``Array(values)`` with one copy of the values instead of three (``np.save`` into a
    growing ``BytesIO``, then out of it): the same ``.npy`` bytes for a C-ordered array."""
    ordered = values if values.flags.c_contiguous else values.copy(order="C")
    head = io.BytesIO()
    npy.write_array_header_1_0(head, npy.header_data_from_array_1_0(ordered))
    data = b"".join((head.getvalue(), ordered.reshape(-1).view(np.uint8).data))
    return Array(dtype=str(ordered.dtype), shape=ordered.shape, stype=SType.NUMPY, data=data)


def decode(header: dict[str, Any], blobs: Sequence[bytes]) -> RecordDict:
    """The ``RecordDict`` that :func:`encode` described, its arrays' data ``blobs`` as they
    are (no copy)."""
    content = RecordDict()
    given = iter(blobs)
    for name, entries in header["arrays"].items():
        record = ArrayRecord()
        for e in entries:
            data = next(given, None)
            if data is None or len(data) != e["size"]:
                raise ChannelError(f"array {name}/{e['key']} has no blob of {e['size']} bytes")
            shape = tuple(e["shape"])
            record[e["key"]] = Array(dtype=e["dtype"], shape=shape, stype=e["stype"], data=data)
        content[name] = record
    extra = sum(1 for _ in given)
    if extra:
        raise ChannelError(f"frame has {extra} blob(s) no array claims")
    for name, metrics in header["metrics"].items():
        content[name] = MetricRecord(metrics)
    for name, config in header["configs"].items():
        content[name] = ConfigRecord(config)
    return content


def send(sock: socket.socket, header: dict[str, Any], blobs: Sequence[bytes] = ()) -> None:
    """One frame: lengths, header (with the blobs' sizes), blobs."""
    head = json.dumps({**header, SIZES: [len(b) for b in blobs]}).encode()
    sock.sendall(LENGTHS.pack(len(head), sum(len(b) for b in blobs)))
    sock.sendall(head)
    for blob in blobs:
        sock.sendall(blob)


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[bytes]]:
    """One frame from ``sock``: (its header, its blobs). ``sock`` should be blocking (a
    Python timeout makes ``MSG_WAITALL`` return early: each blob would then be joined from
    pieces, a copy); bound a wait with ``SO_RCVTIMEO`` instead (:func:`receive_within`)."""
    head_size, body_size = LENGTHS.unpack(_read(sock, LENGTHS.size))
    if head_size > MAX_HEADER:
        raise ChannelError(f"frame header of {head_size} bytes: not a warm-worker peer")
    try:
        header = json.loads(_read(sock, head_size))
    except ValueError as exc:
        raise ChannelError(f"frame header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ChannelError("frame header is not a JSON object")
    sizes = header.pop(SIZES, None)
    if not _sizes_of(sizes, body_size):
        raise ChannelError(f"frame's blob sizes {str(sizes)[:80]} do not add up to {body_size}")
    return header, [_read(sock, size) for size in sizes]


def receive_within(sock: socket.socket, seconds: float) -> tuple[dict[str, Any], list[bytes]]:
    """:func:`receive`, each read of it waiting at most ``seconds`` (an ``OSError`` then)."""
    whole = int(seconds)
    sock.settimeout(None)
    sock.setsockopt(
        socket.SOL_SOCKET,
        socket.SO_RCVTIMEO,
        TIMEVAL.pack(whole, int((seconds - whole) * 1e6)),
    )
    return receive(sock)


def _sizes_of(sizes: object, total: int) -> bool:
    """Whether ``sizes`` is a list of byte counts adding up to ``total``."""
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        return False
    return sum(sizes) == total


def same_token(given: object, expected: str) -> bool:
    """Whether ``given`` is the node's secret (constant time: no timing oracle)."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def _read(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``, received into the object returned; pieces (a signal or
    a timeout cut the wait short) are joined."""
    pieces: list[bytes] = []
    got = 0
    while got < size:
        piece = sock.recv(size - got, socket.MSG_WAITALL)
        if not piece:
            raise ChannelError(f"peer closed the connection after {got} of {size} bytes")
        pieces.append(piece)
        got += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
