"""The wire between a ClientApp and its node's warm worker (:mod:`client_app.worker`).

One frame each way per call: two 8-byte big-endian lengths, a JSON header, then the raw
bytes of every array back to back. A Flower ``RecordDict`` crosses as it is: array records
as each ``Array``'s dtype, shape, stype and data (NumPy's own ``.npy`` bytes, read back
with ``allow_pickle=False``), metric and config records as JSON. Never pickle: a peer can
make the other side run nothing but the task it names.

Light on purpose (stdlib and Flower only): the ClientApp that imports it must not pay for
torch, which is the whole point of the worker.
"""

from __future__ import annotations

import hmac
import json
import socket
import struct
from collections.abc import Sequence
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

LENGTHS = struct.Struct(">QQ")  # header bytes, body bytes
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


def decode(header: dict[str, Any], body: memoryview) -> RecordDict:
    """The ``RecordDict`` that :func:`encode` described, its arrays cut from ``body``."""
    content = RecordDict()
    offset = 0
    for name, entries in header["arrays"].items():
        record = ArrayRecord()
        for e in entries:
            data = bytes(body[offset : offset + e["size"]])
            offset += e["size"]
            shape = tuple(e["shape"])
            record[e["key"]] = Array(dtype=e["dtype"], shape=shape, stype=e["stype"], data=data)
        content[name] = record
    if offset != len(body):
        raise ChannelError(f"frame body has {len(body) - offset} bytes no array claims")
    for name, metrics in header["metrics"].items():
        content[name] = MetricRecord(metrics)
    for name, config in header["configs"].items():
        content[name] = ConfigRecord(config)
    return content


def send(sock: socket.socket, header: dict[str, Any], blobs: Sequence[bytes] = ()) -> None:
    """One frame: lengths, header, body."""
    head = json.dumps(header).encode()
    sock.sendall(LENGTHS.pack(len(head), sum(len(b) for b in blobs)))
    sock.sendall(head)
    for blob in blobs:
        sock.sendall(blob)


def receive(sock: socket.socket) -> tuple[dict[str, Any], memoryview]:
    """One frame from ``sock``: (its header, its body)."""
    head_size, body_size = LENGTHS.unpack(_read(sock, LENGTHS.size))
    if head_size > MAX_HEADER:
        raise ChannelError(f"frame header of {head_size} bytes: not a warm-worker peer")
    try:
        header = json.loads(bytes(_read(sock, head_size)))
    except ValueError as exc:
        raise ChannelError(f"frame header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ChannelError("frame header is not a JSON object")
    return header, _read(sock, body_size)


def same_token(given: object, expected: str) -> bool:
    """Whether ``given`` is the node's secret (constant time: no timing oracle)."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def _read(sock: socket.socket, size: int) -> memoryview:
    buffer = memoryview(bytearray(size))
    got = 0
    while got < size:
        n = sock.recv_into(buffer[got:])
        if n == 0:
            raise ChannelError(f"peer closed the connection after {got} of {size} bytes")
        got += n
    return buffer
