"""Checks on a training reply before it may touch the body; a bad reply is dropped, not fatal.

A reply's pseudo-gradient is decoded here (``compression``), so aggregation only ever sees
float32 tensors of the shapes that were sent."""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from dept import keys
from dept.compression import CompressionError, decode, payload_keys


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
    info = content.config_records.get(keys.INFO)
    source = info.get(keys.SOURCE) if info is not None else None
    return str(source) if source else "?"


def check_train_reply(
    content: RecordDict,
    shapes: dict[str, tuple[int, ...]],
    max_weight: float,
    row_ids: np.ndarray | None = None,
    compression: str = "none",
) -> tuple[dict[str, np.ndarray], float]:
    """The reply's pseudo-gradient (keyed like what was sent, decoded to float32) and its
    weight, or :class:`RejectedReply`.

    The weight is tokens trained, so it cannot exceed what the round's local steps can
    consume (``max_weight``): a larger claim would let one client outweigh all others.
    ``row_ids`` (TRIM) are the φ rows the source was sent; the reply must name the same.
    ``compression`` is how every client encodes its Δ (:mod:`dept.compression`).
    """
    arrays = content.array_records.get(keys.ARRAYS)
    metrics = content.metric_records.get(keys.METRICS)
    if arrays is None or metrics is None or keys.INFO not in content.config_records:
        raise RejectedReply(f"missing record(s); has {sorted(content.keys())}")
    weight = finite_metric(metrics, keys.NUM_EXAMPLES)
    if not 0 < weight <= max_weight:
        raise RejectedReply(f"'{keys.NUM_EXAMPLES}' is {weight}; expected (0, {max_weight:.0f}]")
    if row_ids is not None:
        if keys.EMBEDDING_IDS not in arrays:
            raise RejectedReply(f"no '{keys.EMBEDDING_IDS}' beside the embedding rows")
        if not np.array_equal(_read(arrays, keys.EMBEDDING_IDS), row_ids):
            raise RejectedReply(f"'{keys.EMBEDDING_IDS}' differ from the rows it was sent")
        arrays = ArrayRecord({k: v for k, v in arrays.items() if k != keys.EMBEDDING_IDS})
    return _decode(arrays, shapes, compression), weight


def check_vocabulary(content: RecordDict, num_rows: int) -> np.ndarray:
    """TRIM: a source's V_k from its query reply: sorted, unique ids below ``num_rows``."""
    arrays = content.array_records.get(keys.ARRAYS)
    if arrays is None or keys.EMBEDDING_IDS not in arrays:
        raise RejectedReply(f"the vocabulary reply has no '{keys.EMBEDDING_IDS}' array")
    ids = _read(arrays, keys.EMBEDDING_IDS)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise RejectedReply(f"'{keys.EMBEDDING_IDS}' must be a non-empty 1-D integer array")
    if ids[0] < 0 or ids[-1] >= num_rows or not (np.diff(ids) > 0).all():
        raise RejectedReply(f"'{keys.EMBEDDING_IDS}' must be sorted unique ids in [0, {num_rows})")
    return ids.astype(np.int64)


def _read(arrays: ArrayRecord, name: str) -> np.ndarray:
    try:
        return arrays[name].numpy()
    except Exception as exc:  # any undecodable payload (wrong type, truncated, object dtype)
        raise RejectedReply(f"'{name}' cannot be read as an array: {exc!r}") from exc


def finite_metric(metrics: MetricRecord, key: str) -> float:
    """``metrics[key]`` as a finite float, or :class:`RejectedReply`."""
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RejectedReply(f"'{key}' must be a finite number, got {value!r}")
    return float(value)


def _decode(
    arrays: ArrayRecord, shapes: dict[str, tuple[int, ...]], compression: str
) -> dict[str, np.ndarray]:
    expected = payload_keys(set(shapes), compression)
    missing, extra = sorted(expected - arrays.keys()), sorted(arrays.keys() - expected)
    if missing or extra:
        raise RejectedReply(
            f"keys differ from what was sent: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    received = {name: _tensor(arrays, name) for name in expected}
    try:
        delta = decode(received, shapes, compression)
    except CompressionError as exc:
        raise RejectedReply(f"{compression} payload: {exc}") from exc
    return {name: value.numpy() for name, value in delta.items()}


def _tensor(arrays: ArrayRecord, name: str) -> torch.Tensor:
    value = _read(arrays, name)
    try:
        return torch.from_numpy(value)  # shares the memory Flower decoded into
    except (TypeError, ValueError) as exc:  # a dtype or byte order torch has no tensor for
        raise RejectedReply(f"'{name}' has unsupported dtype {value.dtype}: {exc}") from exc
