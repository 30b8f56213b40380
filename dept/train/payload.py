"""What a source's round sends up and keeps: its pseudo-gradient encoded for the trip
(``compression``), with error feedback adding back what the last message lost, and no value
beyond what the server will accept for it (its reach: one round's, or a fragment's over the
rounds since its base, computed as the server computes it). With fragments, what the node
keeps of its body between syncs (:func:`body_files`)."""

from __future__ import annotations

import torch

from dept.config import DeptConfig
from dept.model.families import EMBEDDING_NAMES
from dept.train.local import max_round_update, max_span_update
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
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(what travels for ``delta``, what it loses and the next round adds back). ``kept``:
    the residual the last round saved, which is saved again with this round's state, so a
    re-run round sends the same bytes; ``arrays``: what the server sent (its largest weight
    sizes the reach, as on the server). With fragments only φ and the synced fragments
    travel; the residual of the others is kept as it is."""
    kind, spans = cfg.compression, {}
    if plan is not None:  # the spans of the synced fragments' tensors, over the whole body
        names = (n for n in delta if n not in EMBEDDING_NAMES)
        spans = synced_spans(names, plan, server_round)
        delta = {n: v for n, v in delta.items() if n in spans or n in EMBEDDING_NAMES}
    if kind == "none" or not cfg.compression_error_feedback:
        return encode(delta, kind, cfg.topk_density), {}
    biggest = max(float(v.abs().max()) for v in arrays.values())
    one_round = max_round_update(cfg, global_step, biggest)
    limit = {n: max_span_update(cfg, spans[n], biggest) if n in spans else one_round for n in delta}
    residual = kept  # with fragments: the sent ones' (zero where one never was sent)
    if plan is not None and kept:
        residual = {n: kept.get(n, torch.zeros_like(v)) for n, v in delta.items()}
    payload, lost = compress_with_feedback(delta, residual, kind, limit, cfg.topk_density)
    return payload, kept | lost if plan is not None else lost


def body_files(base: dict[str, torch.Tensor], local: dict[str, torch.Tensor]) -> dict:
    """What a node keeps of its body with fragments: its trained θ and each fragment's base."""
    body = [n for n in base if n not in EMBEDDING_NAMES]
    return {f"local/{n}": local[n] for n in body} | {f"base/{n}": base[n] for n in body}
