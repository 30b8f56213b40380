"""Per-source metrics per round and the communication ledger of a run.

Communication is counted from the payloads actually sent and received (bytes of the
serialized arrays). Two references put it in context, both per participating client:
``bytes_full_model_fedavg`` — sending the client's whole model (body + embeddings) down
and up every round, as FedAvg on everything would; ``bytes_ddp_equivalent`` — a gradient of
the whole model up and down at *every* local step, as synchronous data-parallel training
of the same steps would.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from dept import keys

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
    global_step: int
    sampled: int = 0
    train: dict[str, dict[str, float]] = field(default_factory=dict)
    eval: dict[str, dict[str, float]] = field(default_factory=dict)
    rejected: list[dict[str, str]] = field(default_factory=list)  # refused updates, named
    clipped: list[dict[str, str]] = field(default_factory=list)  # too large, scaled down
    failed: list[dict[str, str]] = field(default_factory=list)  # error replies, no reply
    ignored: list[dict[str, str]] = field(default_factory=list)  # unsolicited, duplicates
    state_events: list[dict[str, str]] = field(default_factory=list)  # lost or damaged state
    bytes_up: int = 0
    bytes_down: int = 0
    wall_s: float = 0.0  # since the run started, when the round ended


class RunHistory:
    """Everything the strategy learns per round, in a form ready for JSON."""

    def __init__(self, body_params: int) -> None:
        self.body_params = body_params
        self.comm = CommLedger()
        self.rounds: dict[int, RoundRecord] = {}
        self.embedding_params: dict[str, int] = {}
        self.oracle_bpb: dict[str, float] = {}
        self.conflicts: list[dict[str, str]] = []  # nodes refused a source another one serves

    def at(self, server_round: int, global_step: int = 0) -> RoundRecord:
        if server_round not in self.rounds:
            self.rounds[server_round] = RoundRecord(server_round, global_step)
        return self.rounds[server_round]

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

    def record_eval(self, server_round: int, source: str, metrics: dict[str, float]) -> None:
        self.at(server_round).eval[source] = dict(metrics)
        self.embedding_params.setdefault(source, int(metrics.get(keys.EMBEDDING_PARAMS, 0)))
        oracle = metrics.get(keys.ORACLE_BPB, -1.0)
        if oracle >= 0:
            self.oracle_bpb[source] = oracle

    def sources(self) -> list[str]:
        names = {s for r in self.rounds.values() for s in (*r.train, *r.eval)}
        return sorted(names)

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
        values = (
            [m[keys.VAL_BPB] for m in self.rounds[server_round].eval.values()]
            if server_round in self.rounds
            else []
        )
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
    def from_state_dict(cls, state: dict[str, Any]) -> RunHistory:
        history = cls(int(state["body_params"]))
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
        wall_s = record.wall_s
        per_source: dict[str, dict[str, float]] = {}
        for source in sorted({*record.train, *record.eval}):
            train, ev = record.train.get(source, {}), record.eval.get(source, {})
            per_source[source] = {
                "train_loss": train.get(keys.TRAIN_LOSS, math.nan),
                "val_loss": ev.get(keys.VAL_LOSS, math.nan),
                "val_ppl": ev.get(keys.VAL_PPL, math.nan),
                "val_bpb": ev.get(keys.VAL_BPB, math.nan),
                "tokens": train.get(keys.NUM_EXAMPLES, 0),
                "tokens_per_s": train.get(keys.TOKENS_PER_S, math.nan),
                "bytes_up": train.get("bytes_up", 0),
                "bytes_down": train.get(keys.BYTES_RECEIVED, 0),
                "update_rms": train.get("update_rms", math.nan),
                "update_max": train.get("update_max", math.nan),
            }
        return {
            "round": server_round,
            "global_step": record.global_step,
            "wall_s": round(wall_s, 3),
            "sampled": record.sampled,
            "avg_val_bpb": self.mean_val_bpb(server_round),
            "sources": per_source,
            "rejected": record.rejected,
            "clipped": record.clipped,
            "failed": record.failed,
            "ignored": record.ignored,
            "state_events": record.state_events,
            "bytes_up": record.bytes_up,
            "bytes_down": record.bytes_down,
        }
