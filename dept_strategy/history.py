"""Per-source metrics per round and the communication ledger of a run.

Communication is counted from the payloads actually sent and received (bytes of the
serialized arrays). Two references put it in context, both per participating client:
``bytes_full_model_fedavg`` — sending the client's whole model (body + embeddings) down
and up every round, as FedAvg on everything would; ``bytes_ddp_equivalent`` — a gradient of
the whole model up and down at *every* local step, as synchronous data-parallel training
of the same steps would.

The history is also where every reply that did not count is written down, and logged, with
its reason (:meth:`RunHistory.failed`, :meth:`~RunHistory.rejected`, ...): the round's line
in ``metrics.jsonl`` and the ``problems`` of ``summary.json`` are read from it.

``global_step`` of a round is the step of the global learning-rate schedule at the *start*
of the round's training, the one its clients are sent: ``(round - 1) * local_steps``, and 0
for round 0 (the evaluation before any training). The round's evaluation comes after its
``local_steps`` more.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from dept.wire import keys
from dept_strategy.validation import last_line

log = logging.getLogger(__name__)
FLOAT32_BYTES = 4


@dataclass
class CommLedger:
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_down_eval: int = 0
    bytes_full_model_fedavg: int = 0
    bytes_ddp_equivalent: int = 0

    def add_participation(self, body_params: int, embedding_params: int, local_steps: int) -> None:
        full_model = (body_params + embedding_params) * FLOAT32_BYTES
        self.bytes_full_model_fedavg += 2 * full_model
        self.bytes_ddp_equivalent += 2 * full_model * local_steps

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = dict(asdict(self))
        sent = self.bytes_up + self.bytes_down
        out["reduction_vs_ddp"] = self.bytes_ddp_equivalent / sent if sent else math.nan
        out["reduction_vs_full_model_fedavg"] = (
            self.bytes_full_model_fedavg / sent if sent else math.nan
        )
        return out


@dataclass
class RoundRecord:
    round: int
    global_step: int  # at the start of the round's training (module docstring)
    sampled: int = 0
    train: dict[str, dict[str, float]] = field(default_factory=dict)
    eval: dict[str, dict[str, float]] = field(default_factory=dict)
    rejected: list[dict[str, str]] = field(default_factory=list)  # refused updates, named
    clipped: list[dict[str, str]] = field(default_factory=list)  # too large, scaled down
    failed: list[dict[str, str]] = field(default_factory=list)  # error replies, no reply
    ignored: list[dict[str, str]] = field(default_factory=list)  # unsolicited, duplicates
    state_events: list[dict[str, str]] = field(default_factory=list)  # lost or damaged state
    # per source {"theta": L2 norm, "phi": ...} of its accepted update (dept_strategy.diagnostics)
    update_norms: dict[str, dict[str, float]] = field(default_factory=dict)
    interference: dict[str, Any] = field(default_factory=dict)  # cosines of pairs of updates
    diagnostics_s: float = 0.0  # server seconds the two took
    privacy: dict[str, float] = field(default_factory=dict)  # central DP: ε so far, clipped
    # per source, its θ update's agreement with the others' (dept_strategy.direction)
    agreement: dict[str, float] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0
    wall_s: float = 0.0  # since the run started, when the round ended


class RunHistory:
    """Everything the strategy learns per round, in a form ready for JSON."""

    def __init__(self, body_params: int, local_steps: int) -> None:
        self.body_params = body_params
        self.local_steps = local_steps
        self.comm = CommLedger()
        self.rounds: dict[int, RoundRecord] = {}
        self.embedding_params: dict[str, int] = {}
        self.oracle_bpb: dict[str, float] = {}
        self.conflicts: list[dict[str, str]] = []  # nodes refused a source another one serves

    def global_step(self, server_round: int) -> int:
        """Step of the global LR schedule at the start of ``server_round`` (1-based; 0 for
        round 0, before training)."""
        return max(server_round - 1, 0) * self.local_steps

    def at(self, server_round: int) -> RoundRecord:
        """The record of ``server_round``, made with its global step the first time anything
        happens in it (a failed discovery query as much as a training message)."""
        if server_round not in self.rounds:
            self.rounds[server_round] = RoundRecord(server_round, self.global_step(server_round))
        return self.rounds[server_round]

    def failed(self, server_round: int, node: int, reason: str, source: str | None = None) -> None:
        """An error reply, or none in time, for ``source`` on ``node``. Without ``source``: a
        node that could not say which sources it serves (discovery logs those with their
        cause)."""
        why = last_line(reason)
        if source is None:
            self.at(server_round).failed.append({"node": str(node), "reason": why})
            return
        log.warning("round %d: source %s on node %d failed: %s", server_round, source, node, why)
        self.at(server_round).failed.append({"node": str(node), "source": source, "reason": why})

    def rejected(self, server_round: int, node: int, reason: str, source: str) -> None:
        """A reply refused (malformed, out of range, too large): it counts for nothing."""
        entries = self.at(server_round).rejected
        self._note(server_round, "rejected the reply for", entries, node, reason, source)

    def clipped(self, server_round: int, node: int, reason: str, source: str) -> None:
        """An update too large, scaled down before it was combined."""
        entries = self.at(server_round).clipped
        self._note(server_round, "clipped the update of", entries, node, reason, source)

    def _note(
        self,
        server_round: int,
        what: str,
        entries: list[dict[str, str]],
        node: int,
        reason: str,
        source: str,
    ) -> None:
        log.warning(
            "round %d: %s source %s from node %d: %s", server_round, what, source, node, reason
        )
        entries.append({"node": str(node), "source": source, "reason": reason})

    def ignored(self, server_round: int, node: int, reason: str) -> None:
        """A reply credited to nobody (unsolicited, or a duplicate)."""
        log.warning("round %d: ignored a reply from node %d: %s", server_round, node, reason)
        self.at(server_round).ignored.append({"node": str(node), "reason": reason})

    def state_event(self, server_round: int, node: int, event: str, source: str) -> None:
        """What a node said about ``source``'s state (lost, damaged, started afresh)."""
        log.warning("round %d: source %s: %s", server_round, source, event)
        self.at(server_round).state_events.append(
            {"node": str(node), "source": source, "event": event}
        )

    def why_nothing_trained(self, server_round: int) -> str | None:
        """None if an update of ``server_round`` was taken; else its failures and refusals."""
        record = self.at(server_round)
        if record.train:
            return None
        return "; ".join(sorted({e["reason"] for e in (*record.failed, *record.rejected)}))

    def round_ended(self, server_round: int, wall_s: float) -> None:
        """``wall_s``: seconds since the run started, as ``server_round`` ended."""
        self.at(server_round).wall_s = wall_s

    def elapsed_s(self) -> float:
        """Seconds the run had taken when its latest round ended (0.0 before any ended): a
        resumed run's clock goes on from there."""
        return self.rounds[max(self.rounds)].wall_s if self.rounds else 0.0

    def record_bytes_up(self, server_round: int, count: int) -> None:
        """Bytes of a reply's arrays, counted whether the update is accepted or not."""
        self.at(server_round).bytes_up += count
        self.comm.bytes_up += count

    def record_train(
        self, server_round: int, source: str, metrics: dict[str, float], bytes_up: int
    ) -> None:
        record = self.at(server_round)
        record.train[source] = {**metrics, "bytes_up": bytes_up}
        emb = int(metrics.get(keys.EMBEDDING_PARAMS, 0))
        self.embedding_params[source] = emb
        self.comm.add_participation(self.body_params, emb, int(metrics.get(keys.LOCAL_STEPS, 0)))

    def record_diagnostics(self, server_round: int, found: dict[str, Any], seconds: float) -> None:
        """``update_norms`` and, where computed, ``interference`` and ``agreement`` of the
        round's updates."""
        record = self.at(server_round)
        record.update_norms = found["update_norms"]
        record.interference = found.get("interference", {})
        record.agreement = found.get("agreement", {})
        record.diagnostics_s = seconds

    def privacy(self) -> dict[str, float]:
        """The newest round's central DP figures (ε so far); empty where DP is off."""
        released = [r.privacy for _, r in sorted(self.rounds.items()) if r.privacy]
        return released[-1] if released else {}

    def drift(self, server_round: int) -> dict[str, dict[str, float]]:
        """Per source that reported its local model's score (``drift-eval``): bits per byte
        ``before`` averaging (its own model after its local steps), ``after`` (the averaged
        model, where evaluated that round) and ``drift`` = after − before."""
        record = self.at(server_round)
        out = {}
        for source, train in sorted(record.train.items()):
            if keys.LOCAL_VAL_BPB not in train:
                continue
            before = train[keys.LOCAL_VAL_BPB]
            after = record.eval.get(source, {}).get(keys.VAL_BPB, math.nan)
            out[source] = {"before": before, "after": after, "drift": after - before}
        return out

    def record_eval(self, server_round: int, source: str, metrics: dict[str, float]) -> None:
        self.at(server_round).eval[source] = dict(metrics)
        self.embedding_params.setdefault(source, int(metrics.get(keys.EMBEDDING_PARAMS, 0)))
        oracle = metrics.get(keys.ORACLE_BPB, -1.0)
        if oracle >= 0:
            self.oracle_bpb[source] = oracle

    def sources(self) -> list[str]:
        """The sources with a result that counted (an update taken or an evaluation)."""
        names = {s for r in self.rounds.values() for s in (*r.train, *r.eval)}
        return sorted(names)

    def never_succeeded(self) -> list[str]:
        """The sources named only by replies that failed or were refused: not one result
        of theirs counted, so only :meth:`failures` says anything of them."""
        named = {e["source"] for e in self._failed_or_refused() if "source" in e}
        return sorted(named - set(self.sources()))

    def failures(self, source: str) -> list[str]:
        """Why replies for ``source`` did not count (an error, none in time, refused),
        oldest first."""
        return [e["reason"] for e in self._failed_or_refused() if e.get("source") == source]

    def _failed_or_refused(self) -> Iterator[dict[str, str]]:
        for _, record in sorted(self.rounds.items()):
            yield from (*record.failed, *record.rejected)

    def unserved_nodes(self) -> dict[str, str]:
        """``{node: reason}`` for the nodes that, in the run's last round, still could not
        say which sources they serve (so no source of theirs is known by name)."""
        if not self.rounds:
            return {}
        last = self.rounds[max(self.rounds)]
        return {e["node"]: e["reason"] for e in last.failed if "source" not in e}

    def latest_eval(self, source: str) -> tuple[int, dict[str, float]] | None:
        for server_round in sorted(self.rounds, reverse=True):
            if source in self.rounds[server_round].eval:
                return server_round, self.rounds[server_round].eval[source]
        return None

    def last_trained(self, source: str, before_round: int) -> int:
        """The last round before ``before_round`` whose update of ``source`` was taken; -1."""
        rounds = [r for r, rec in self.rounds.items() if r < before_round and source in rec.train]
        return max(rounds, default=-1)

    def tokens_trained(self, source: str) -> int:
        return int(
            sum(r.train.get(source, {}).get(keys.NUM_EXAMPLES, 0) for r in self.rounds.values())
        )

    def mean_val_bpb(self, server_round: int) -> float:
        """The sources' mean bits per byte in ``server_round``, summed in source order: a
        float sum depends on its order, and replies arrive in any (two runs would differ
        in the last digits)."""
        record = self.rounds.get(server_round)
        values = [m[keys.VAL_BPB] for _, m in sorted(record.eval.items())] if record else []
        return sum(values) / len(values) if values else math.nan

    def state_dict(self) -> dict[str, Any]:
        """Everything, as JSON-ready data (for checkpoints)."""
        return {
            "body_params": self.body_params,
            "comm": asdict(self.comm),
            "rounds": [asdict(r) for _, r in sorted(self.rounds.items())],
            "embedding_params": self.embedding_params,
            "oracle_bpb": self.oracle_bpb,
            "conflicts": self.conflicts,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], local_steps: int) -> RunHistory:
        """``local_steps``: the run's (its config holds it, and a resumed run must match)."""
        history = cls(int(state["body_params"]), local_steps)
        history.comm = CommLedger(**state["comm"])
        history.rounds = {int(r["round"]): RoundRecord(**r) for r in state["rounds"]}
        history.embedding_params = {k: int(v) for k, v in state["embedding_params"].items()}
        history.oracle_bpb = {k: float(v) for k, v in state["oracle_bpb"].items()}
        history.conflicts = list(state.get("conflicts", []))
        return history

    def problems(self) -> list[dict[str, Any]]:
        """Everything that did not go as planned, by round: error or missing replies
        (``failed``), refused updates and evaluations (``rejected``), updates too large and
        scaled down to the round's median (``clipped``), replies credited to
        nobody (``ignored``), lost or damaged client state (``state``), and nodes refused a
        source (``conflict``); each names its source (where known), node and reason."""
        found: list[dict[str, Any]] = []
        for server_round, record in sorted(self.rounds.items()):
            for kind, entries in (
                ("failed", record.failed),
                ("rejected", record.rejected),
                ("clipped", record.clipped),
                ("ignored", record.ignored),
                ("state", record.state_events),
            ):
                found.extend({"round": server_round, "kind": kind, **e} for e in entries)
        found.extend({**c, "round": int(c["round"]), "kind": "conflict"} for c in self.conflicts)
        return sorted(found, key=lambda p: p["round"])

    def round_json(self, server_round: int) -> dict[str, Any]:
        """One line of ``metrics.jsonl``."""
        record = self.rounds[server_round]
        per_source = {
            source: source_row(record.train.get(source, {}), record.eval.get(source, {}))
            for source in sorted({*record.train, *record.eval})
        }
        drift = self.drift(server_round)  # only with drift-eval on
        return {
            "round": server_round,
            "global_step": record.global_step,
            "wall_s": round(record.wall_s, 3),
            "sampled": record.sampled,
            "avg_val_bpb": self.mean_val_bpb(server_round),
            "avg_val_bpb_sources": sorted(record.eval),  # what that average is over
            "sources": per_source,
            "rejected": record.rejected,
            "clipped": record.clipped,
            "failed": record.failed,
            "ignored": record.ignored,
            "state_events": record.state_events,
            "update_norms": record.update_norms,
            "interference": record.interference,
            "diagnostics_s": round(record.diagnostics_s, 4),
            "bytes_up": record.bytes_up,
            "bytes_down": record.bytes_down,
            **({"drift": drift} if drift else {}),
            **({"agreement": record.agreement} if record.agreement else {}),
            **({"privacy": record.privacy} if record.privacy else {}),
        }


def source_row(train: dict[str, float], ev: dict[str, float]) -> dict[str, float | int]:
    """Every number of one source in one round, from its taken update (``train``) and its
    evaluation (``ev``): NaN where it has none, counts (tokens, steps, bytes) as integers.
    A row of ``metrics.csv``, and a source of a ``metrics.jsonl`` line."""
    return {
        "train_loss": train.get(keys.TRAIN_LOSS, math.nan),
        "train_final_loss": train.get(keys.TRAIN_FINAL_LOSS, math.nan),
        "val_loss": ev.get(keys.VAL_LOSS, math.nan),
        "val_ppl": ev.get(keys.VAL_PPL, math.nan),
        "val_bpb": ev.get(keys.VAL_BPB, math.nan),
        "tokens": int(train.get(keys.NUM_EXAMPLES, 0)),
        "local_steps": int(train.get(keys.LOCAL_STEPS, 0)),
        "train_s": train.get(keys.TRAIN_SECONDS, math.nan),
        "tokens_per_s": train.get(keys.TOKENS_PER_S, math.nan),
        "bytes_up": int(train.get("bytes_up", 0)),
        "bytes_down": int(train.get(keys.BYTES_RECEIVED, 0)),
        "update_rms": train.get("update_rms", math.nan),
        "update_max": train.get("update_max", math.nan),
        # GLOB and TRIM: the φ update over the shared rows its round saw, and the rest
        "embedding_rows_seen": int(train.get(keys.EMBEDDING_ROWS_SEEN, 0)),
        "embedding_update_seen_rms": train.get(keys.EMBEDDING_UPDATE_SEEN_RMS, math.nan),
        "embedding_update_unseen_rms": train.get(keys.EMBEDDING_UPDATE_UNSEEN_RMS, math.nan),
        "val_tokens": int(ev.get(keys.VAL_TOKENS, 0)),
        "val_bytes": int(ev.get(keys.VAL_BYTES, 0)),
    }
