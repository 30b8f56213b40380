"""Partial synchronisation (Streaming DiLoCo): the body θ cut into fragments of contiguous
layers, each synchronised on its own staggered schedule.

Fragment f of ``count`` syncs in the rounds r with (r + offset_f) % period == 0, offsets
spread evenly over the period (:func:`offsets`), so every round syncs about count / period
fragments and each fragment syncs every ``period`` rounds; the run's last round syncs them
all. Between its syncs a fragment keeps its local progress on the node; at a sync the
source sends Δ_f = base_f − local_f, against the global value of f it last received
(base_f), and the server steps f alone.

Each global fragment has a version: the round its value last changed on the server (0 for
the initial body). A node keeps its local body, the bases and their versions in its round
state; :func:`start_body` makes the round's starting body from them and what the server
sent. This module is shared by both sides and knows nothing of Flower.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

LAYER_INDEX = re.compile(r"\.(\d+)\.")  # model.layers.3.mlp... / transformer.h.3.attn...


def partition(names: Iterable[str], count: int) -> dict[str, int]:
    """name → fragment of a body's tensors: layer l of L goes to fragment l·count // L, so
    fragments are contiguous groups of layers of near-equal size; tensors outside the layers
    (final norm, learned positions) go with the last. Depends on the set of names only, so
    a server and a node that list them in different orders agree."""
    names = sorted(names)
    layers = {n: int(m.group(1)) for n in names if (m := LAYER_INDEX.search(n))}
    num_layers = max(layers.values(), default=-1) + 1
    if not 1 <= count <= num_layers:
        raise ValueError(
            f"'fragments' is {count}; the body has {num_layers} layers, and a fragment is "
            f"at least one: choose 1..{max(num_layers, 1)}"
        )
    return {n: layers[n] * count // num_layers if n in layers else count - 1 for n in names}


def offsets(count: int, period: int) -> tuple[int, ...]:
    """Each fragment's offset in [0, period): fragment f gets f·period // count, so every
    residue, hence every round, has at least one fragment when count >= period."""
    return tuple(f * period // count for f in range(count))


def syncing(server_round: int, count: int, period: int, last_round: int = 0) -> tuple[int, ...]:
    """The fragments synchronised in ``server_round`` (ascending): all of them in
    ``last_round``, so the body a run ends with holds every source's last steps in every
    fragment rather than fragments up to ``period`` − 1 rounds stale."""
    return tuple(
        f
        for f, offset in enumerate(offsets(count, period))
        if (server_round + offset) % period == 0 or server_round == last_round
    )


@dataclass(frozen=True)
class FragmentPlan:
    """What a train message says of the fragments: each one's version on the server, and
    which ones the reply must carry Δ of."""

    versions: tuple[int, ...]
    sync: tuple[int, ...]


@dataclass(frozen=True)
class HeldBody:
    """A node's body between rounds: its trained ``local`` values, the global ``base`` each
    fragment started from, and the versions of those bases."""

    local: dict[str, torch.Tensor]
    base: dict[str, torch.Tensor]
    versions: tuple[int, ...]


def start_body(
    received: Mapping[str, torch.Tensor], held: HeldBody | None, plan: FragmentPlan
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base, start) of the round's body: for each fragment, the server's value where it sent
    one newer than what the node holds (base and start both), else the node's own (its base,
    and its local progress to train on). ``received`` holds body tensors only.

    A node with no body of its own takes ``received`` as the whole body (if it is not, the
    model refuses it by name). A fragment neither sent nor held at the plan's version cannot
    be rebuilt: a ValueError. Either fails the round for this source, after which the server
    sends the whole body."""
    if held is None:
        return dict(received), dict(received)
    parts = partition(held.base, len(plan.versions))
    base: dict[str, torch.Tensor] = {}
    start: dict[str, torch.Tensor] = {}
    for fragment, version in enumerate(plan.versions):
        members = [n for n, f in parts.items() if f == fragment]
        sent = all(n in received for n in members)
        if held.versions[fragment] == version:
            base |= {n: held.base[n] for n in members}
            start |= {n: held.local[n] for n in members}
        elif sent:
            base |= {n: received[n] for n in members}
            start |= {n: received[n] for n in members}
        else:
            raise ValueError(
                f"fragment {fragment} of the body was not sent and this node holds version "
                f"{held.versions[fragment]}, "
                f"not version {version}: the server must send the whole body"
            )
    return base, start


def span(version: int, server_round: int) -> range:
    """The rounds whose local training a fragment's Δ can hold in ``server_round`` when its
    base has ``version``: a base made by round v reaches a node in round v + 1 at the
    earliest, and the node trains on from it, round after round, until the fragment syncs."""
    return range(version + 1, server_round + 1)


def synced_spans(names: Iterable[str], plan: FragmentPlan, server_round: int) -> dict[str, range]:
    """The :func:`span` of each synced body tensor's Δ in ``server_round``. Both sides take
    it from the plan's versions: the node's base of a fragment has exactly that version
    (kept or taken fresh, :func:`start_body`), and the server planned them, so neither
    reads it from the other's word."""
    parts = partition(names, len(plan.versions))
    return {n: span(plan.versions[f], server_round) for n, f in parts.items() if f in plan.sync}
