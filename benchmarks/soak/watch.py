"""What the soak reads of a running federation: rounds as they complete, and each fault's
recovery from them.

A round counts when its line appears in ``metrics.jsonl``; a re-run round (after a server
resume) appears again with another wall time and counts again, while the lines a resumed
server rewrites from its checkpoint are ones already seen.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.soak.faults import SERVER_KINDS

COLUMNS = ["kind", "target", "at_s", "done_before", "recovery_s", "rounds_lost"]
COLUMNS += ["resumed_after", "detail"]  # :meth:`Fault.as_row`, in order


@dataclass(frozen=True)
class Completion:
    seen_at: float  # time.monotonic() when the soak first read the line
    round: int
    trained: frozenset[str]  # the sources whose update the round took


@dataclass
class Fault:
    kind: str
    target: str  # a source, or "server"
    at: float  # time.monotonic() of the injection
    done_before: int  # the newest round completed when it was injected (-1: none)
    detail: str = ""
    recovered_at: float | None = None
    rounds_lost: int = 0
    resumed_after: int | None = None  # server faults: the checkpoint the resume took

    def as_row(self, start: float) -> dict[str, object]:
        recovery = self.recovered_at - self.at if self.recovered_at is not None else None
        return {
            "kind": self.kind,
            "target": self.target,
            "at_s": round(self.at - start, 2),
            "done_before": self.done_before,
            "recovery_s": round(recovery, 2) if recovery is not None else None,
            "rounds_lost": self.rounds_lost,
            "resumed_after": self.resumed_after,
            "detail": self.detail,
        }


@dataclass
class Rounds:
    """The completions read so far from one output folder's ``metrics.jsonl``."""

    metrics: Path
    completions: list[Completion] = field(default_factory=list)
    _seen: set[tuple[int, float]] = field(default_factory=set)

    def poll(self) -> None:
        try:
            lines = self.metrics.read_text().splitlines()
        except FileNotFoundError:
            return
        now = time.monotonic()
        for text in lines:
            try:
                line = json.loads(text)
            except json.JSONDecodeError:  # a line being written
                continue
            key = (int(line["round"]), float(line["wall_s"]))
            if key in self._seen:
                continue
            self._seen.add(key)
            trained = frozenset(s for s, m in line["sources"].items() if m.get("tokens"))
            self.completions.append(Completion(now, key[0], trained))

    @property
    def done(self) -> int:
        """The newest round completed (-1: none)."""
        return max((c.round for c in self.completions), default=-1)

    def settle(self, fault: Fault) -> bool:
        """Mark ``fault`` recovered (and count its lost rounds) once the federation shows
        it: for a server fault, the first round completed after it; for a node fault, the
        first round after the one in flight in which its source trained again."""
        if fault.recovered_at is not None:
            return True
        for c in self.completions:
            if c.seen_at <= fault.at:
                continue
            if fault.kind in SERVER_KINDS and fault.resumed_after is not None:
                fault.recovered_at = c.seen_at
                fault.rounds_lost = max(0, fault.done_before - fault.resumed_after)
                return True
            if c.round > fault.done_before and fault.target in c.trained:
                fault.recovered_at = c.seen_at
                fault.rounds_lost = max(0, c.round - fault.done_before - 1)
                return True
        return False
