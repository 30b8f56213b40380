"""The fragment partition, the staggered schedule and a node's starting body."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from dept.config import DeptConfig
from dept.train.local import max_round_update, max_span_update, round_start_step
from dept.train.source_client import SourceClient
from dept.wire.compression import decode
from dept.wire.fragments import (
    FragmentPlan,
    HeldBody,
    offsets,
    partition,
    span,
    start_body,
    synced_spans,
    syncing,
)

# a 4-layer body as HF names it, with a final norm outside the layers
BODY = [f"model.layers.{i}.{p}" for i in range(4) for p in ("attn.w", "mlp.w")]
BODY += ["model.norm.weight"]


def test_partition_is_contiguous_layers_and_order_free() -> None:
    parts = partition(BODY, 2)
    assert parts == partition(reversed(BODY), 2)
    assert {n for n, f in parts.items() if f == 0} == {
        n for n in BODY if n.startswith(("model.layers.0.", "model.layers.1."))
    }
    assert parts["model.norm.weight"] == 1  # outside the layers: with the last
    assert partition(["model.layers.10.w", "model.layers.2.w", *BODY], 4)["model.layers.10.w"] == 3
    with pytest.raises(ValueError, match="'fragments' is 5; the body has 4 layers"):
        partition(BODY, 5)


@pytest.mark.parametrize(("count", "period"), [(4, 2), (4, 4), (3, 2), (5, 3), (2, 1), (4, 3)])
def test_every_fragment_syncs_every_period_rounds_and_every_round_syncs(
    count: int, period: int
) -> None:
    rounds = range(1, 4 * period + 1)
    synced = {r: syncing(r, count, period) for r in rounds}
    for fragment in range(count):
        at = [r for r in rounds if fragment in synced[r]]
        assert at[0] <= period and all(b - a == period for a, b in itertools.pairwise(at))
    assert all(synced[r] for r in rounds)  # no round without a sync
    sizes = [len(s) for s in synced.values()]
    assert max(sizes) - min(sizes) <= 1  # spread evenly
    assert offsets(4, 2) == (0, 0, 1, 1)


def test_the_last_round_syncs_every_fragment() -> None:
    assert syncing(6, 4, 4) == (2,)
    assert syncing(6, 4, 4, last_round=6) == (0, 1, 2, 3)
    assert syncing(5, 4, 4, last_round=6) == syncing(5, 4, 4)


def _tensors(value: float) -> dict[str, torch.Tensor]:
    return {n: torch.full((2,), value) for n in BODY}


def test_start_body_keeps_local_progress_where_the_version_matches() -> None:
    # Prepare: the node holds versions (3, 5); the server is at (3, 7) and sends fragment 1
    held = HeldBody(local=_tensors(1.0), base=_tensors(0.5), versions=(3, 5))
    fragment_1 = {n for n, f in partition(BODY, 2).items() if f == 1}
    received = {n: v for n, v in _tensors(9.0).items() if n in fragment_1}
    # Execute
    base, start = start_body(received, held, FragmentPlan(versions=(3, 7), sync=(0,)))
    # Assert: fragment 0 is the node's own (base and progress), fragment 1 the server's
    for name in BODY:
        want_base, want_start = (9.0, 9.0) if name in fragment_1 else (0.5, 1.0)
        assert base[name][0] == want_base and start[name][0] == want_start, name
    # the server sending a fragment the node holds at that version changes nothing
    again, _ = start_body(_tensors(9.0), held, FragmentPlan(versions=(3, 5), sync=(0,)))
    assert all(again[n][0] == 0.5 for n in BODY)
    assert synced_spans(BODY, FragmentPlan((3, 7), (0,)), 8).keys() == set(BODY) - fragment_1


def test_a_fragment_neither_sent_nor_held_is_an_error() -> None:
    held = HeldBody(local=_tensors(1.0), base=_tensors(0.5), versions=(3, 5))
    with pytest.raises(ValueError, match=r"fragment 1 .* holds version 5, not version 7"):
        start_body({}, held, FragmentPlan(versions=(3, 7), sync=(0,)))
    # a node without a body of its own takes what came as the whole of it
    base, start = start_body(_tensors(2.0), None, FragmentPlan(versions=(3, 7), sync=(0,)))
    assert base.keys() == start.keys() == set(BODY)


def test_a_fragment_not_sent_keeps_its_error_feedback_residual() -> None:
    # Prepare: int8 with error feedback; fragment 1 synced; fragment 0 holds a residual
    cfg = DeptConfig(compression="int8", fragments=2, fragment_period=2)
    client = SimpleNamespace(cfg=cfg)  # _payload reads the config only
    delta = {n: torch.linspace(-1e-3, 1e-3, 300) for n in BODY}
    parts = partition(BODY, 2)
    residual = {n: torch.full((300,), 1e-5) for n in BODY if parts[n] == 0}
    state = SimpleNamespace(residual=residual)
    plan = FragmentPlan(versions=(0, 0), sync=(1,))
    # Execute
    payload, kept = SourceClient._payload(
        client, delta, state, _tensors(1.0), 5, plan, server_round=1
    )
    # Assert: only fragment 1 travels; fragment 0's residual is as it was, fragment 1 has one
    assert {n for n in payload if "@" not in n} == {n for n in BODY if parts[n] == 1}
    assert kept.keys() == set(BODY)
    for name in BODY:
        if parts[name] == 0:
            assert torch.equal(kept[name], residual[name])
        else:
            sent = decode(
                {k: v for k, v in payload.items() if k.startswith(name)}, {name: (300,)}, "int8"
            )
            assert torch.allclose(sent[name] + kept[name], delta[name])


def test_a_fragment_held_over_rounds_sends_what_they_could_move_and_withholds_nothing() -> None:
    # Prepare: fragment 1's base is the initial body's (version 0); in round 3 it syncs, its
    # Δ twice what one round can move a weight (weights of 1.0): three rounds may move that
    cfg = DeptConfig(compression="int8", fragments=2, fragment_period=2, local_steps=4)
    client = SimpleNamespace(cfg=cfg)
    one_round = max_round_update(cfg, round_start_step(cfg, 3), 1.0)
    delta = {n: torch.full((300,), 2 * one_round) for n in BODY}
    plan = FragmentPlan(versions=(0, 0), sync=(1,))
    # Execute
    payload, kept = SourceClient._payload(
        client, delta, None, _tensors(1.0), round_start_step(cfg, 3), plan, server_round=3
    )
    # Assert: it all went up (a constant decodes exactly in int8); nothing is kept back
    parts = partition(BODY, 2)
    synced = [n for n in BODY if parts[n] == 1]
    sent = decode(payload, {n: (300,) for n in synced}, "int8")
    for name in synced:
        assert torch.equal(sent[name], delta[name]) and torch.all(kept[name] == 0), name
    assert max_span_update(cfg, span(0, 3), 1.0) > 2 * one_round
