"""What a source's round sends up and keeps: its pseudo-gradient encoded for the trip
(``compression``), with error feedback adding back what the last message lost, and no value
beyond what the server will accept for it (its reach: one round's, or a fragment's over the
rounds since its base, computed as the server computes it). With fragments, what the node
keeps of its body between syncs (:func:`body_files`)."""

from __future__ import annotations

import torch

from dept.config import DeptConfig
from dept.model.roles import EMBEDDING_NAMES
from dept.train.local import max_round_update, max_span_update
from dept.train.seen_rows import SentRows
from dept.wire.compression import compress_with_feedback, encode
from dept.wire.fragments import FragmentPlan, synced_spans


def round_payload(
    cfg: DeptConfig,
    delta: dict[str, torch.Tensor],
    kept: dict[str, torch.Tensor],
    arrays: dict[str, torch.Tensor],
    global_step: int,
    plan: FragmentPlan | None,
    server_round: int,
    rows: SentRows | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(what travels for ``delta``, what it loses and the next round adds back). ``kept``:
    the residual the last round saved, which is saved again with this round's state, so a
    re-run round sends the same bytes; ``arrays``: what the server sent (its largest weight
    sizes the reach, as on the server). With fragments only φ and the synced fragments
    travel; the residual of the others is kept as it is. ``rows``: the φ rows that travel
    (with their ids, and counts), where not the whole φ; the residual stays whole, so a row
    not sent keeps what it holds, and a row's own update is never owed where it was not
    sent."""
    kind, spans = cfg.compression, {}
    if plan is not None:  # the spans of the synced fragments' tensors, over the whole body
        names = (n for n in delta if n not in EMBEDDING_NAMES)
        spans = synced_spans(names, plan, server_round)
        delta = {n: v for n, v in delta.items() if n in spans or n in EMBEDDING_NAMES}
    beside = rows.arrays() if rows is not None else {}
    sent = _cut(delta, rows)
    if kind == "none" or not cfg.compression_error_feedback:
        return encode(sent, kind, cfg.topk_density) | beside, {}
    biggest = max(float(v.abs().max()) for v in arrays.values())
    one_round = max_round_update(cfg, global_step, biggest)
    limit = {n: max_span_update(cfg, spans[n], biggest) if n in spans else one_round for n in delta}
    residual = kept  # with fragments: the sent ones' (zero where one never was sent)
    if (plan is not None or rows is not None) and kept:
        residual = {n: kept.get(n, torch.zeros_like(v)) for n, v in delta.items()}
    payload, lost = compress_with_feedback(
        sent, _cut(residual, rows), kind, limit, cfg.topk_density
    )
    lost = _uncut(lost, residual or {n: torch.zeros_like(v) for n, v in delta.items()}, rows)
    return payload | beside, kept | lost if plan is not None else lost


def _cut(tensors: dict[str, torch.Tensor], rows: SentRows | None) -> dict[str, torch.Tensor]:
    """``tensors`` with φ cut to ``rows``' positions (all of it where ``rows`` is None)."""
    if rows is None or not tensors:
        return dict(tensors)
    at = torch.from_numpy(rows.positions)
    return {n: v[at] if n in EMBEDDING_NAMES else v for n, v in tensors.items()}


def _uncut(
    cut: dict[str, torch.Tensor], whole: dict[str, torch.Tensor], rows: SentRows | None
) -> dict[str, torch.Tensor]:
    """``whole`` with ``cut``'s φ rows written back at ``rows``' positions, and ``cut``'s
    other tensors as they are."""
    if rows is None:
        return cut
    at = torch.from_numpy(rows.positions)
    out = {}
    for name, value in cut.items():
        if name in EMBEDDING_NAMES:
            value, part = whole[name].clone(), value
            value[at] = part
        out[name] = value
    return out


def body_files(base: dict[str, torch.Tensor], local: dict[str, torch.Tensor]) -> dict:
    """What a node keeps of its body with fragments: its trained θ and each fragment's base."""
    body = [n for n in base if n not in EMBEDDING_NAMES]
    return {f"local/{n}": local[n] for n in body} | {f"base/{n}": base[n] for n in body}
