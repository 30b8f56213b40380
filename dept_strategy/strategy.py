"""The DEPT strategy: what each sampled source receives, and how the replies are aggregated.

Round t: sample sources (found through :mod:`dept_strategy.discovery`), send each source's
node the shared tensors with the round's global step, receive pseudo-gradients
Δ_k = shared_{t-1} − shared_k weighted by tokens trained, check and decode each one
(float32, fp16 or int8: ``compression``), average them as they come
(:mod:`dept_strategy.aggregate`), and take the outer optimizer step.

What is shared, by variant:

- SPEC, SPEC-OPT: the body θ only; embeddings never leave the nodes.
- GLOB: θ and the whole global φ (FedAvg on the whole model).
- TRIM: θ and the rows of φ in the source's V_k (asked once, :mod:`dept_strategy.vocabularies`);
  each row is averaged over the sampled sources that hold it.
"""

from __future__ import annotations

import logging
import math
import random
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dept.config import COMPRESSIONS
from dept_strategy import keys
from dept_strategy.aggregate import RoundMean
from dept_strategy.discovery import SourceDirectory
from dept_strategy.history import RunHistory
from dept_strategy.inflight import InFlight, Target
from dept_strategy.outer import OuterOptimizer
from dept_strategy.validation import (
    RejectedReply,
    check_train_reply,
    finite_metric,
    finite_metrics,
    last_line,
    reply_source,
)
from dept_strategy.vocabularies import SourceVocabularies

log = logging.getLogger(__name__)


class DeptStrategy(Strategy):
    """Samples sources, aggregates body pseudo-gradients, keeps per-source metrics."""

    def __init__(
        self,
        *,
        outer: OuterOptimizer,
        local_steps: int,
        run_id: str,
        fraction_train: float = 1.0,
        min_train_nodes: int = 1,
        min_train_replies: int = 1,
        fraction_evaluate: float = 1.0,
        min_available_nodes: int = 1,
        wait_for_nodes_s: float = 120.0,
        query_timeout_s: float = 600.0,
        max_tokens_per_round: float = math.inf,
        num_rounds: int = 0,
        seed: int = 0,
        embedding_names: tuple[str, ...] = (),
        trim: bool = False,
        compression: str = "none",
    ) -> None:
        """``embedding_names``: the φ tensors among the outer optimizer's (GLOB, TRIM);
        ``trim``: send each source only its V_k rows of them; ``compression``: how the
        clients encode their pseudo-gradients (what goes down stays float32)."""
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        if not 0 <= fraction_evaluate <= 1:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        if local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, got {local_steps}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        self.compression = compression
        self.outer = outer
        self.local_steps = local_steps
        self.run_id = run_id
        self.fraction_train = fraction_train
        self.min_train_nodes = max(1, min_train_nodes)
        self.min_train_replies = max(1, min_train_replies)
        self.fraction_evaluate = fraction_evaluate
        self.max_tokens_per_round = max_tokens_per_round
        self.num_rounds = num_rounds
        self.in_flight = InFlight()
        self.attempt = uuid.uuid4().hex[:12]
        self.resumed_after = -1
        self.directory = SourceDirectory(
            run_id=run_id,
            min_nodes=min_available_nodes,
            wait_s=wait_for_nodes_s,
            query_timeout_s=query_timeout_s,
        )
        self.rng = random.Random(seed)
        self.eval_rng = random.Random(seed + 1)  # evaluation draws do not shift training's
        self.shapes = outer.shapes()
        self.embedding_names = embedding_names
        self.vocabularies = (
            SourceVocabularies(
                run_id=run_id,
                num_rows=self.shapes[embedding_names[0]][0],
                timeout_s=query_timeout_s,
            )
            if trim and embedding_names
            else None
        )
        body_params = sum(
            int(np.prod(s)) for n, s in self.shapes.items() if n not in embedding_names
        )
        self.history = RunHistory(body_params=body_params)

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors, JSON-ready rest): everything a resumed run needs to continue exactly."""
        tensors, outer = self.outer.state_dict()
        for source, ids in (self.vocabularies.ids if self.vocabularies else {}).items():
            tensors[f"vocab/{source}"] = torch.from_numpy(ids)
        meta = {
            "run_id": self.run_id,
            "outer": outer,
            "rng": _rng_state(self.rng),
            "eval_rng": _rng_state(self.eval_rng),
            "history": self.history.state_dict(),
        }
        return tensors, meta

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        if meta["run_id"] != self.run_id:
            raise ValueError(f"checkpoint of run {meta['run_id']!r}, not {self.run_id!r}")
        self.outer.load_state_dict(tensors, meta["outer"])
        if self.vocabularies is not None:
            self.vocabularies.ids = {
                key.removeprefix("vocab/"): value.numpy()
                for key, value in tensors.items()
                if key.startswith("vocab/")
            }
        self.rng.setstate(_rng_tuple(meta["rng"]))
        self.eval_rng.setstate(_rng_tuple(meta["eval_rng"]))
        self.history = RunHistory.from_state_dict(meta["history"])

    def summary(self) -> None:
        shared = "θ only"
        if self.embedding_names:
            shared = "θ + φ rows in V_k" if self.vocabularies else "θ + the whole φ"
        log.info(
            "DEPT strategy: outer %s, fraction-train %.2f (min %d), %d local steps, "
            "body %d parameters, sends %s, updates come back %s",
            self.outer.kind,
            self.fraction_train,
            self.min_train_nodes,
            self.local_steps,
            self.history.body_params,
            shared,
            "float32" if self.compression == "none" else f"as {self.compression}",
        )

    def global_step(self, server_round: int) -> int:
        """Step of the global LR schedule at the start of ``server_round`` (1-based)."""
        return (server_round - 1) * self.local_steps

    def wait_for_sources(
        self, grid: Grid, server_round: int = 0, expected: frozenset[str] = frozenset()
    ) -> dict[str, int]:
        """``{source: node}`` once enough nodes (and the ``expected`` sources, as far as the
        wait allows) are there; bounded by ``wait-for-nodes-s``."""
        return self.directory.wait(grid, server_round, self._failure_logger(server_round), expected)

    def _target_failure_logger(self, server_round: int) -> Callable[[Target, str], None]:
        def record(target: Target, reason: str) -> None:
            log.warning("round %d: source %s: %s", server_round, target.source, last_line(reason))
            self._failure_logger(server_round, target.source)(target.node, reason)

        return record

    def _failure_logger(
        self, server_round: int, source: str | None = None
    ) -> Callable[[int, str], None]:
        def record(node: int, reason: str) -> None:
            entry = {"node": str(node), "reason": last_line(reason)}
            self.history.at(server_round).failed.append(
                {**entry, "source": source} if source else entry
            )

        return record

    def _sample(
        self, grid: Grid, server_round: int, fraction: float, minimum: int, rng: random.Random
    ) -> dict[str, int]:
        owners = self.directory.refresh(grid, server_round, self._failure_logger(server_round))
        if not owners:
            owners = self.wait_for_sources(grid, server_round)
        k = min(len(owners), max(minimum, math.floor(len(owners) * fraction)))
        chosen = sorted(rng.sample(sorted(owners), k))
        targets = {source: owners[source] for source in chosen}
        if self.vocabularies is None:
            return targets
        known, received = self.vocabularies.ensure(
            grid, targets, self._target_failure_logger(server_round)
        )
        self.history.record_bytes_up(server_round, received)
        return known

    def _identify(self, config: ConfigRecord) -> None:
        """Which run and which attempt at it: a node drops state a crashed attempt left."""
        config[keys.RUN_ID] = self.run_id
        config[keys.ATTEMPT] = self.attempt
        config[keys.RESUMED_AFTER] = self.resumed_after

    def _arrays_for(
        self, source: str, arrays: ArrayRecord, phi: dict[str, np.ndarray]
    ) -> ArrayRecord:
        """What ``source`` receives: ``arrays`` as is, or with φ cut to its V_k rows (TRIM)."""
        if self.vocabularies is None:
            return arrays
        rows = self.vocabularies.ids[source]
        trimmed = ArrayRecord()
        for name in arrays:
            if name in phi:
                trimmed[name] = Array(phi[name][rows])
            else:
                trimmed[name] = arrays[name]  # the same θ payload, not a copy
        return trimmed

    def _expected(self, source: str) -> tuple[dict[str, tuple[int, ...]], np.ndarray | None]:
        """Shapes a reply from ``source`` must have, and its φ row ids (TRIM)."""
        if self.vocabularies is None:
            return self.shapes, None
        if source not in self.vocabularies.ids:
            raise RejectedReply(f"no vocabulary is known for source {source!r}")
        rows = self.vocabularies.ids[source]
        shapes = {
            n: (len(rows), *s[1:]) if n in self.embedding_names else s
            for n, s in self.shapes.items()
        }
        return shapes, rows

    def _messages(
        self, arrays: ArrayRecord, config: ConfigRecord, targets: dict[str, int], message_type: str
    ) -> tuple[list[Message], int]:
        """One message per source, to the node serving it, and the bytes of their arrays."""
        messages, sent = [], 0
        phi = {n: arrays[n].numpy() for n in self.embedding_names} if self.vocabularies else {}
        for source, node in targets.items():
            per_source = ConfigRecord({**config, keys.SOURCE: source})
            shared = self._arrays_for(source, arrays, phi)
            sent += shared.count_bytes()
            record = RecordDict({keys.ARRAYS: shared, keys.CONFIG: per_source})
            message = Message(content=record, dst_node_id=node, message_type=message_type)
            self.in_flight.track(message, Target(node, source))
            messages.append(message)
        return messages, sent

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        targets = self._sample(
            grid, server_round, self.fraction_train, self.min_train_nodes, self.rng
        )
        config[keys.SERVER_ROUND] = server_round
        config[keys.GLOBAL_STEP] = self.global_step(server_round)
        self._identify(config)
        record = self.history.at(server_round, self.global_step(server_round))
        record.sampled = len(targets)
        log.info("round %d: training %s", server_round, ", ".join(targets))
        messages, sent = self._messages(arrays, config, targets, MessageType.TRAIN)
        record.bytes_down += sent
        self.history.comm.bytes_down += sent
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        mean = RoundMean(self.shapes, self.embedding_names)
        loss_sum, accepted = 0.0, 0
        answered: list[str] = []  # ids only: each reply is dropped once it is added
        for reply in replies:  # may be a stream of replies as they arrive
            answered.append(reply.metadata.reply_to_message_id)
            if (weighted_loss := self._accumulate(server_round, reply, mean)) is not None:
                loss_sum += weighted_loss
                accepted += 1
        self._record_missing(server_round, answered)
        if mean.weight <= 0 or accepted < self.min_train_replies:
            log.warning(
                "round %d: %d usable training replies, fewer than %d (config key "
                "'min-train-replies'); the model is unchanged",
                server_round,
                accepted,
                self.min_train_replies,
            )
            return None, None
        result = mean.result()
        if result is None:
            log.warning(
                "round %d: the averaged update is not finite; the model is unchanged", server_round
            )
            return None, None
        delta, frozen_rows = result
        self.outer.step(delta, frozen_rows)
        metrics = MetricRecord(
            {keys.TRAIN_LOSS: loss_sum / mean.weight, keys.NUM_EXAMPLES: mean.weight}
        )
        return ArrayRecord(self.outer.tensors()), metrics

    def _accumulate(self, server_round: int, reply: Message, mean: RoundMean) -> float | None:
        """Add one reply's weighted Δ to ``mean``; its weight × train loss, None if dropped."""
        target = self._target(reply)
        if reply.has_error():
            self._record_error(server_round, reply, target)
            return None
        arrays = reply.content.array_records.get(keys.ARRAYS)
        bytes_up = arrays.count_bytes() if arrays is not None else 0
        self.history.record_bytes_up(server_round, bytes_up)
        try:
            self._check_source(reply, target)
            shapes, rows = self._expected(target.source)
            delta, weight = check_train_reply(
                reply.content, shapes, self.max_tokens_per_round, rows, self.compression
            )
        except RejectedReply as exc:
            self._record_rejected(server_round, target, exc)
            return None
        mean.add(delta, weight, rows)
        metrics = finite_metrics(reply.content.metric_records[keys.METRICS])
        self.history.record_train(server_round, target.source, metrics, bytes_up)
        return weight * metrics.get(keys.TRAIN_LOSS, math.nan)

    def _target(self, reply: Message) -> Target:
        """Whom a reply is from: by the message it answers, else by what it says."""
        known = self.in_flight.target_of(reply)
        if known is not None:
            return known
        source = reply_source(reply.content) if reply.has_content() else "?"
        return Target(reply.metadata.src_node_id, source)

    @staticmethod
    def _check_source(reply: Message, target: Target) -> None:
        said = reply_source(reply.content)
        if said != target.source:
            raise RejectedReply(f"answered for source {said!r}, was asked for {target.source!r}")

    def _record_error(self, server_round: int, reply: Message, target: Target) -> None:
        log.warning(
            "round %d: source %s on node %d failed: %s",
            server_round,
            target.source,
            target.node,
            reply.error.reason,
        )
        self._failure_logger(server_round, target.source)(target.node, reply.error.reason or "?")
        self.directory.forget(target.node)  # it may have restarted serving other data

    def _record_rejected(self, server_round: int, target: Target, exc: Exception) -> None:
        log.warning(
            "round %d: rejected the reply for source %s from node %d: %s",
            server_round,
            target.source,
            target.node,
            exc,
        )
        self.history.at(server_round).rejected.append(
            {"node": str(target.node), "source": target.source, "reason": str(exc)}
        )

    def _record_missing(self, server_round: int, answered: list[str]) -> None:
        """Sampled sources whose node did not answer within ``round-timeout-s``."""
        for target in self.in_flight.unanswered(answered):
            reason = "no reply within the round timeout"
            log.warning(
                "round %d: source %s on node %d: %s",
                server_round,
                target.source,
                target.node,
                reason,
            )
            self._failure_logger(server_round, target.source)(target.node, reason)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # Every source is evaluated before training and after the last round, so the
        # before/after comparison always covers the same sources.
        everyone = server_round in (0, self.num_rounds)
        fraction = 1.0 if everyone else self.fraction_evaluate
        if fraction == 0:
            return []
        targets = self._sample(grid, server_round, fraction, 1, self.eval_rng)
        config[keys.SERVER_ROUND] = server_round
        self._identify(config)
        messages, sent = self._messages(arrays, config, targets, MessageType.EVALUATE)
        self.history.comm.bytes_down_eval += sent
        return messages

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        replies = list(replies)
        for reply in replies:
            target = self._target(reply)
            if reply.has_error():
                self._record_error(server_round, reply, target)
                continue
            metrics = reply.content.metric_records.get(keys.METRICS)
            try:
                self._check_source(reply, target)
                if metrics is None:
                    raise RejectedReply(f"no '{keys.METRICS}' record")
                finite_metric(metrics, keys.VAL_BPB)
            except RejectedReply as exc:
                self._record_rejected(server_round, target, exc)
                continue
            self.history.record_eval(server_round, target.source, finite_metrics(metrics))
        self._record_missing(server_round, [r.metadata.reply_to_message_id for r in replies])
        mean = self.history.mean_val_bpb(server_round)
        return None if math.isnan(mean) else MetricRecord({keys.VAL_BPB: mean})


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_tuple(state: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return version, tuple(internal), gauss
