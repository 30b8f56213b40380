"""Checks on a training reply before it may touch the body; a bad reply is dropped, not fatal.

A reply's pseudo-gradient is decoded here (``compression``), so aggregation only ever sees
float32 tensors of the shapes that were sent. It is read in place: the arrays are views of
the bytes the message holds, decoded one tensor at a time (:class:`CheckedReply`), so the
server never holds a second, decoded copy of a reply."""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from dept.wire import keys
from dept.wire.compression import TOPK_DENSITY, CompressionError, decode_array, payload_keys

Record = TypeVar("Record", ArrayRecord, MetricRecord, ConfigRecord)


def record_of(content: RecordDict, key: str, kind: type[Record]) -> Record | None:
    """``content[key]`` if it is a ``kind`` record, else None.

    Not ``content.array_records`` and its siblings: each builds a dict in a reference cycle
    that holds the whole ``content`` (a body, for a training reply) until the garbage
    collector next runs, so the replies of a round would pile up."""
    value = content.get(key)
    return value if isinstance(value, kind) else None


class RejectedReply(ValueError):
    """The reply cannot be aggregated; the message says why (for the log and the report)."""


REASON_CHARS = 400  # a reason longer than this (Ray's out-of-memory report) is cut


def last_line(reason: str | None) -> str:
    """The line of an error reason that says what went wrong (tracebacks end with it), cut
    to ``REASON_CHARS`` so a report stays readable."""
    lines = (reason or "").strip().splitlines()
    line = lines[-1].strip() if lines else "?"
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def finite_metrics(metrics: MetricRecord) -> dict[str, float]:
    """The record's finite scalar metrics; lists, NaN and infinities are left out."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def reply_source(content: RecordDict) -> str:
    info = record_of(content, keys.INFO, ConfigRecord)
    source = info.get(keys.SOURCE) if info is not None else None
    return str(source) if source else "?"


@dataclass(frozen=True)
class ReplyRows:
    """Which rows of the φ tensors ``names`` a training reply may carry (GLOB, TRIM): of
    ``allowed`` (sorted global ids: TRIM's V_k; None: any of the ``num_rows``), every one
    (TRIM under ``embedding-rows=all``), or with ``seen`` those its round saw, a non-empty
    subset named by their ids, each with how often its token occurred."""

    names: tuple[str, ...]
    num_rows: int
    allowed: np.ndarray | None = None
    seen: bool = False


@dataclass(frozen=True)
class CheckedReply:
    """A reply's pseudo-gradient as it travelled (read-only views of the message's arrays),
    its weight and its finite metrics; :meth:`tensors` decodes it one tensor at a time
    (``density``: top-k's share of values, which fixes how many each tensor must hold).
    ``rows``: the global ids of the φ rows it carries (None: φ whole, or none), with
    ``counts`` (``embedding-rows=seen``) how often each occurred in its round."""

    arrays: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    compression: str
    weight: float
    metrics: dict[str, float]
    density: float = TOPK_DENSITY
    rows: np.ndarray | None = None
    counts: np.ndarray | None = None

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, float32 value) in the order of ``shapes``, or :class:`RejectedReply` at the
        first tensor that does not decode (wrong dtype or length, NaN, bad scales, codes
        out of range, indices out of range or repeated)."""
        for name, shape in self.shapes.items():
            try:
                yield name, decode_array(self.arrays, name, shape, self.compression, self.density)
            except CompressionError as exc:
                raise RejectedReply(f"{self.compression} payload: {exc}") from exc


def check_train_reply(
    content: RecordDict,
    shapes: dict[str, tuple[int, ...]],
    max_weight: float,
    rows: ReplyRows | None = None,
    compression: str = "none",
    density: float = TOPK_DENSITY,
) -> CheckedReply:
    """The reply's pseudo-gradient (keyed like what was sent), weight and metrics, or
    :class:`RejectedReply`; its values are checked as :meth:`CheckedReply.tensors` decodes
    them.

    The weight is tokens trained, so it cannot exceed what the round's local steps can
    consume (``max_weight``): a larger claim would let one client outweigh all others.
    ``rows`` (GLOB and TRIM where a reply carries only some φ rows): which it may name
    (:class:`ReplyRows`); ``shapes`` are the whole tensors', φ's cut to the rows named.
    ``compression`` is how every client encodes its Δ (:mod:`dept.wire.compression`), with
    top-k's ``density``.
    """
    arrays = record_of(content, keys.ARRAYS, ArrayRecord)
    metrics = record_of(content, keys.METRICS, MetricRecord)
    if arrays is None or metrics is None or record_of(content, keys.INFO, ConfigRecord) is None:
        raise RejectedReply(f"missing record(s); has {sorted(content.keys())}")
    weight = finite_metric(metrics, keys.NUM_EXAMPLES)
    if not 0 < weight <= max_weight:
        raise RejectedReply(f"'{keys.NUM_EXAMPLES}' is {weight}; expected (0, {max_weight:.0f}]")
    finite_metric(metrics, keys.TRAIN_LOSS)  # a NaN loss is a training that went wrong
    ids = counts = None
    beside: set[str] = set()
    if rows is not None:
        ids, counts = _row_ids(arrays, rows, weight)
        beside = {keys.EMBEDDING_IDS, keys.EMBEDDING_COUNTS} if rows.seen else {keys.EMBEDDING_IDS}
        shapes = {n: (len(ids), *s[1:]) if n in rows.names else s for n, s in shapes.items()}
    expected = payload_keys(set(shapes), compression)
    names = set(arrays.keys()) - beside
    missing, extra = sorted(expected - names), sorted(names - expected)
    if missing or extra:
        raise RejectedReply(
            f"keys differ from what was sent: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    views = {name: _read(arrays, name) for name in sorted(expected)}
    found = finite_metrics(metrics)
    return CheckedReply(views, shapes, compression, weight, found, density, ids, counts)


def _row_ids(
    arrays: ArrayRecord, rows: ReplyRows, weight: float
) -> tuple[np.ndarray, np.ndarray | None]:
    """(the φ row ids a reply names, their occurrence counts where ``rows.seen``), or
    :class:`RejectedReply`. Under ``seen`` the ids are a non-empty sorted subset of what the
    source holds, and each count at least 1 and all of them together at most two per
    token trained (a sequence of T + 1 tokens trains T); else exactly what it holds."""
    if keys.EMBEDDING_IDS not in arrays:
        raise RejectedReply(f"no '{keys.EMBEDDING_IDS}' beside the embedding rows")
    ids = _read(arrays, keys.EMBEDDING_IDS)
    if not rows.seen:
        if rows.allowed is None or not np.array_equal(ids, rows.allowed):
            raise RejectedReply(f"'{keys.EMBEDDING_IDS}' differ from the rows it was sent")
        return ids.astype(np.int64), None
    _check_ids(ids, rows.num_rows)
    if rows.allowed is not None and not np.isin(ids, rows.allowed).all():
        raise RejectedReply(f"'{keys.EMBEDDING_IDS}' names rows the source was not sent")
    if keys.EMBEDDING_COUNTS not in arrays:
        raise RejectedReply(f"no '{keys.EMBEDDING_COUNTS}' beside the embedding rows")
    counts = _read(arrays, keys.EMBEDDING_COUNTS)
    if counts.shape != ids.shape or not np.issubdtype(counts.dtype, np.integer):
        raise RejectedReply(f"'{keys.EMBEDDING_COUNTS}' must be one integer per row id")
    if counts.min() < 1 or counts.sum(dtype=np.float64) > 2 * weight:
        raise RejectedReply(
            f"'{keys.EMBEDDING_COUNTS}' must be >= 1 each and at most {2 * weight:.0f} in all "
            f"(two per token trained)"
        )
    return ids.astype(np.int64), counts.astype(np.float64)


def _check_ids(ids: np.ndarray, num_rows: int) -> None:
    """Row ids must be a non-empty, sorted, unique 1-D integer array below ``num_rows``."""
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise RejectedReply(f"'{keys.EMBEDDING_IDS}' must be a non-empty 1-D integer array")
    if ids[0] < 0 or ids[-1] >= num_rows or not (np.diff(ids) > 0).all():
        raise RejectedReply(f"'{keys.EMBEDDING_IDS}' must be sorted unique ids in [0, {num_rows})")


def check_vocabulary(content: RecordDict, num_rows: int) -> np.ndarray:
    """TRIM: a source's V_k from its query reply: sorted, unique ids below ``num_rows``."""
    arrays = record_of(content, keys.ARRAYS, ArrayRecord)
    if arrays is None or keys.EMBEDDING_IDS not in arrays:
        raise RejectedReply(f"the vocabulary reply has no '{keys.EMBEDDING_IDS}' array")
    ids = _read(arrays, keys.EMBEDDING_IDS)
    _check_ids(ids, num_rows)
    return ids.astype(np.int64)


def _read(arrays: ArrayRecord, name: str) -> np.ndarray:
    try:
        return npy_view(arrays[name])
    except Exception as exc:  # any undecodable payload (wrong type, truncated, object dtype)
        raise RejectedReply(f"'{name}' cannot be read as an array: {exc!r}") from exc


NPY_HEADER_BYTES = 1 << 16  # np.save writes a header of about 128 bytes; format 1.0's limit


def npy_view(array: Array) -> np.ndarray:
    """The array a Flower ``Array`` holds, as a read-only view of its ``.npy`` bytes:
    ``Array.numpy()`` would copy them, a second body per reply of the body."""
    if array.stype != "numpy.ndarray":
        raise TypeError(f"serialisation type {array.stype!r}, not numpy.ndarray")
    header = io.BytesIO(array.data[:NPY_HEADER_BYTES])
    version = np.lib.format.read_magic(header)
    read_header = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran_order, dtype = read_header(header)
    count = math.prod(shape)
    value = np.frombuffer(array.data, dtype=dtype, count=count, offset=header.tell())
    return value.reshape(shape, order="F" if fortran_order else "C")


def finite_metric(metrics: MetricRecord, key: str) -> float:
    """``metrics[key]`` as a finite float, or :class:`RejectedReply`."""
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RejectedReply(f"'{key}' must be a finite number, got {value!r}")
    return float(value)
