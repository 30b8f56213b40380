"""The server's side of the download codec (:mod:`dept.wire.download`): the body it last sent
(θ̂), which sources hold it, and what each train message of a round carries.

Rule: a source whose update the last round accepted holds θ̂ and gets the round's change; any
other (new, missed a round, failed, refused) gets θ̂' whole, in float32. A node that should
hold θ̂ but does not (state lost, a file damaged) says so instead of training
(:data:`dept.wire.keys.NEEDS_BODY`) and is sent the whole body in the same round
(:meth:`dept_strategy.strategy.DeptStrategy.whole_body`). Not checkpointed: after a resume
every source gets the whole body once.

Memory: θ̂ beside θ, one more body on the server (the change's codes are small).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord

from dept.wire import keys
from dept.wire.download import body_digest, encode_change


class DownloadCodec:
    """θ̂ and its holders; :meth:`prepare` makes a round's θ̂' (and its change), which
    :meth:`round_done` turns into the θ̂ of the next round."""

    def __init__(self, kind: str, body_names: Iterable[str]) -> None:
        self.kind = kind
        self.body_names = sorted(body_names)
        self.held: dict[str, torch.Tensor] | None = None  # θ̂ (None: nobody holds a body)
        self.held_digest = ""
        self.holders: set[str] = set()
        self.next: dict[str, torch.Tensor] = {}  # θ̂' of the round under way
        self.next_digest = ""
        self.change: ArrayRecord | None = None  # θ̂' − θ̂ in codes, for the holders of θ̂

    def prepare(self, shared: Mapping[str, torch.Tensor]) -> None:
        """At a train round's start, from the server's θ (``shared``, φ ignored)."""
        body = {n: shared[n] for n in self.body_names}
        if self.held is None:
            self.next, self.change = {n: v.float().clone() for n, v in body.items()}, None
        else:
            codes, self.next = encode_change(body, self.held, self.kind)
            self.change = ArrayRecord(codes)
        self.held = None  # θ̂'s holders get the change; θ̂ itself is no longer needed
        self.next_digest = body_digest(self.next)

    def carry(self, source: str, shared: ArrayRecord) -> tuple[ArrayRecord, dict[str, Any]]:
        """(what ``source``'s train message carries in place of ``shared``'s body, the
        digests its config gets)."""
        others = {n: a for n, a in shared.items() if n not in self.body_names}  # φ, φ's rows
        config: dict[str, Any] = {keys.BODY_DIGEST: self.next_digest}
        if self.change is not None and source in self.holders:
            config[keys.BASE_DIGEST] = self.held_digest
            return ArrayRecord({**others, **self.change}), config
        return ArrayRecord({**others, **ArrayRecord(self.next)}), config

    def forget(self, source: str) -> None:
        """``source`` does not hold θ̂ after all: its next message carries the whole body."""
        self.holders.discard(source)

    def round_done(self, trained: Iterable[str]) -> None:
        """The round's θ̂' is what the sources ``trained`` (their updates taken) now hold."""
        self.held, self.held_digest = self.next, self.next_digest
        self.holders = set(trained)
        self.next, self.change = {}, None
