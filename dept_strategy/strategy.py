"""The DEPT strategy: which sources a round samples, what each receives, and what becomes of
their replies.

Round t: sample sources (found through :mod:`dept_strategy.discovery`) and send each
source's node the shared tensors with the round's global step (:meth:`configure_train`);
then combine their pseudo-gradients Δ_k = shared_{t-1} − shared_k into the outer step, the
pipeline of :mod:`dept_strategy.training_round` (:meth:`aggregate_train`), and credit the
replies that counted. Evaluation is sent and recorded per source the same way.

What is shared is the variant's (:mod:`dept.model.variants`): θ, and ψ where the model learns
positions and the variant shares them, are whole tensors to the strategy; the global φ
(``embedding_names``) goes whole to every source (GLOB) or by each source's V_k rows (TRIM,
asked once, :mod:`dept_strategy.vocabularies`), each row averaged over the sources holding it.

The round loop (:mod:`server_app.federation`) uses the Flower methods and the few public ones
below; what happened is in :attr:`DeptStrategy.history`, which only the strategy writes.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dept.wire import keys
from dept_strategy import discovery
from dept_strategy.discovery import SourceDirectory
from dept_strategy.download import DownloadCodec
from dept_strategy.fragments import FragmentVersions
from dept_strategy.history import RunHistory
from dept_strategy.inflight import InFlight, Target
from dept_strategy.outer import OuterOptimizer
from dept_strategy.replies import Replies
from dept_strategy.screening import UpdateStats, median_stats
from dept_strategy.settings import StrategySettings
from dept_strategy.training_round import Round, largest_weight, train_round
from dept_strategy.validation import ReplyRows
from dept_strategy.vocabularies import SourceVocabularies

log = logging.getLogger(__name__)


class DeptStrategy(Strategy):
    """Samples sources, aggregates body pseudo-gradients, keeps per-source metrics.

    ``outer``: the server's tensors and their optimizer; ``settings``: everything else the
    run config decides (:class:`dept_strategy.settings.StrategySettings`): sampling, what
    is shared and how it travels, how replies are screened and combined (:mod:`.screening`),
    which node keys may serve which source (:mod:`.identity`), the diagnostics recorded
    (:mod:`.diagnostics`) and the fragments the body syncs by (:mod:`.fragments`).
    """

    def __init__(self, outer: OuterOptimizer, settings: StrategySettings) -> None:
        self.outer, self.settings = outer, settings
        self.run_id, self.embedding_names = settings.run_id, settings.embedding_names
        self.spool_dir = settings.spool_dir
        self._own_spool: tempfile.TemporaryDirectory[str] | None = None  # removed with self
        self.reference: UpdateStats | None = None  # the last accepted round's median sizes
        self.in_flight = InFlight()
        self.attempt = uuid.uuid4().hex[:12]
        self.resumed_after = -1  # the checkpointed round a resumed run goes on from
        self.directory = SourceDirectory(
            run_id=settings.run_id,
            min_nodes=settings.min_available_nodes,
            wait_s=settings.wait_for_nodes_s,
            query_timeout_s=settings.query_timeout_s,
            pinned=settings.pinned,
            reask_after_s=math.inf if settings.simulation else discovery.REASK_AFTER_S,
        )
        self.rng = random.Random(settings.seed)
        self.eval_rng = random.Random(settings.seed + 1)  # evaluation draws do not shift training's
        self.shapes = outer.shapes()
        self.vocabularies = self._vocabularies(settings.query_timeout_s) if settings.trim else None
        body = [n for n in self.shapes if n not in self.embedding_names]
        self.history = RunHistory(
            sum(int(np.prod(self.shapes[n])) for n in body), settings.local_steps
        )
        self.fragments = (
            FragmentVersions(
                body,
                count=settings.fragments,
                period=settings.fragment_period,
                last_round=settings.num_server_rounds,
            )
            if settings.fragments > 1
            else None
        )
        kind = settings.download_compression
        self.download = DownloadCodec(kind, body) if kind != "none" else None
        self.train_config = ConfigRecord()  # the round's, for a whole body sent mid-round

    def _vocabularies(self, timeout_s: float) -> SourceVocabularies | None:
        """TRIM's V_k per source (none to keep where no φ is shared)."""
        if not self.embedding_names:
            return None
        rows = self.shapes[self.embedding_names[0]][0]
        return SourceVocabularies(run_id=self.run_id, num_rows=rows, timeout_s=timeout_s)

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors, JSON-ready rest): everything :meth:`resume` needs to continue exactly."""
        tensors, outer = self.outer.state_dict()
        for source, ids in (self.vocabularies.ids if self.vocabularies else {}).items():
            tensors[f"vocab/{source}"] = torch.from_numpy(ids)
        meta = {
            "run_id": self.run_id,
            "outer": outer,
            "rng": self.rng.getstate(),  # tuples: JSON writes them as lists
            "eval_rng": self.eval_rng.getstate(),
            "history": self.history.state_dict(),
            "reference": self.reference.as_dict() if self.reference else None,
        }
        if self.fragments is not None:
            meta["fragments"] = self.fragments.state_dict()
        return tensors, meta

    def resume(
        self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], after_round: int
    ) -> None:
        """Go on from the checkpoint (:meth:`state_dict`) of ``after_round``; the nodes are
        told, so each drops what a crashed attempt left from later rounds."""
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
        self.history = RunHistory.from_state_dict(meta["history"], self.settings.local_steps)
        self.reference = UpdateStats(**meta["reference"]) if meta.get("reference") else None
        if self.fragments is not None:
            self.fragments.load_state_dict(meta["fragments"])
        self.resumed_after = after_round

    def shared_tensors(self) -> ArrayRecord:
        """The tensors every sampled source gets, serialised (θ; with φ for GLOB and TRIM)."""
        return ArrayRecord(self.outer.tensors())

    def final_model(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(θ, the global φ: empty where embeddings stay on the nodes) as they are now."""
        body = self.outer.tensors()
        return body, {name: body.pop(name) for name in self.embedding_names}

    def why_nothing_trained(self, server_round: int) -> str | None:
        """None if an update of ``server_round`` was taken; else its failures and refusals."""
        return self.history.why_nothing_trained(server_round)

    def try_again(self) -> None:
        """The round trained nothing and is tried again: its nodes that failed are asked
        anew which sources they serve (they may have restarted)."""
        self.directory.again()

    def round_ended(self, server_round: int, wall_s: float) -> None:
        """Note the run's wall time (seconds since it started) as ``server_round`` ended."""
        self.history.round_ended(server_round, wall_s)

    def elapsed_s(self) -> float:
        """Wall seconds the run had taken by its latest ended round (0.0 for a fresh one)."""
        return self.history.elapsed_s()

    def summary(self) -> None:
        shared = "the body"
        if self.embedding_names:
            shared = "θ + φ rows in V_k" if self.vocabularies else "θ + the whole φ"
        log.info(
            "DEPT strategy: outer %s, fraction-train %.2f (min %d), %d local steps, "
            "body %d parameters, sends %s, updates come back %s, combined by %s; refused "
            "beyond the inner optimizer's reach%s%s",
            self.outer.kind,
            self.settings.fraction_train,
            self.settings.min_train_nodes,
            self.settings.local_steps,
            self.history.body_params,
            shared,
            "float32" if self.settings.compression == "none" else f"as {self.settings.compression}",
            self.settings.defences.aggregation,
            f" or {self.settings.defences.update_norm_factor:g}x the round's median size"
            if self.settings.defences.update_norm_factor > 0
            else "",
            f"; {len(self.directory.pinned)} source(s) pinned to node keys"
            if self.directory.pinned
            else "",
        )
        privacy = self.settings.privacy
        if privacy.on:
            log.info(
                "central differential privacy: each source's update clipped to L2 norm %g, "
                "noise %g x that on the sum; ε after all %d rounds: %.3g at δ %g (a source "
                "is the privacy unit)",
                privacy.clip_norm,
                privacy.noise_multiplier,
                self.settings.num_server_rounds,
                privacy.epsilon(self.settings.num_server_rounds),
                privacy.delta,
            )
            if self.settings.off_for_privacy:
                log.info(
                    "central differential privacy screens each update on its own (its "
                    "reach): %s off, as each judges an update by the other sources' and so "
                    "would let one source decide whether another's counts",
                    ", ".join(self.settings.off_for_privacy),
                )

    def wait_for_sources(self, grid: Grid) -> dict[str, int]:
        """``{source: node}`` once enough nodes are there, bounded by ``wait-for-nodes-s``;
        a resumed run also waits, as far as that allows, for every source it had."""
        expected = frozenset(self.history.sources())
        return self.directory.wait(grid, 0, self.history, expected)

    def _replies(self, server_round: int) -> Replies:
        return Replies(self.history, self.in_flight, server_round)

    def _close(self, replies: Replies) -> None:
        """The exchange is over: the silent are recorded, the nodes that erred asked again."""
        replies.missing()
        for target in replies.erred:
            self.directory.forget(target.node)
            if self.fragments is not None:
                self.fragments.forget(target.source)

    def _sample(
        self, grid: Grid, server_round: int, fraction: float, minimum: int, rng: random.Random
    ) -> dict[str, int]:
        owners = self.directory.refresh(grid, server_round, self.history)
        if not owners:
            owners = self.directory.wait(grid, server_round, self.history)
        self.history.conflicts.extend(self.directory.conflicts)  # nodes refused a source
        self.directory.conflicts = []
        k = min(len(owners), max(minimum, math.floor(len(owners) * fraction)))
        chosen = sorted(rng.sample(sorted(owners), k))
        targets = {source: owners[source] for source in chosen}
        if self.vocabularies is None:
            return targets
        return self.vocabularies.ensure(grid, targets, server_round, self.history)

    def _identify(self, config: ConfigRecord) -> None:
        """Which run and which attempt at it: a node drops state a crashed attempt left."""
        config[keys.RUN_ID] = self.run_id
        config[keys.ATTEMPT] = self.attempt
        config[keys.RESUMED_AFTER] = self.resumed_after

    def _round_shapes(self, server_round: int) -> dict[str, tuple[int, ...]]:
        """The tensors the replies of ``server_round`` carry: all, or with fragments φ and
        the round's synced fragments."""
        if self.fragments is None:
            return self.shapes
        synced = self.fragments.round_names(server_round)
        return {n: s for n, s in self.shapes.items() if n in synced or n in self.embedding_names}

    def _expected(
        self, shapes: dict[str, tuple[int, ...]], source: str
    ) -> tuple[dict[str, tuple[int, ...]], ReplyRows | None]:
        """Shapes of ``shapes`` a reply from ``source`` must have, and which φ rows it may
        carry where not φ whole (TRIM's V_k; with ``embedding-rows=seen`` those its round
        saw)."""
        seen = self.settings.embedding_rows == "seen"
        if self.vocabularies is not None:
            return shapes, self.vocabularies.rows(source, self.embedding_names, seen)
        if seen and self.embedding_names:
            rows = self.shapes[self.embedding_names[0]][0]
            return shapes, ReplyRows(self.embedding_names, rows, seen=True)
        return shapes, None

    def _messages(
        self, arrays: ArrayRecord, config: ConfigRecord, targets: dict[str, int], message_type: str
    ) -> tuple[list[Message], int]:
        """One message per source, to the node serving it, and the bytes of their arrays."""
        messages, sent = [], 0
        trim = self.vocabularies
        phi = {n: arrays[n].numpy() for n in self.embedding_names} if trim else {}
        before = int(config.get(keys.SERVER_ROUND, 0))  # type: ignore[arg-type]
        if message_type == MessageType.EVALUATE:
            before += 1  # an evaluation uses the state of its own round's training
        for source, node in targets.items():
            last = self.history.last_trained(source, before)
            per_source = ConfigRecord({**config, keys.SOURCE: source, keys.LAST_TRAINED: last})
            shared = trim.trimmed(source, arrays, phi) if trim else arrays
            if self.fragments is not None and message_type == MessageType.TRAIN:
                unsent = self.fragments.unsent(source)
                shared = ArrayRecord({n: a for n, a in shared.items() if n not in unsent})
            if self.download is not None and message_type == MessageType.TRAIN:
                shared, digests = self.download.carry(source, shared)
                per_source = ConfigRecord({**per_source, **digests})
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
            grid,
            server_round,
            self.settings.fraction_train,
            self.settings.min_train_nodes,
            self.rng,
        )
        config[keys.SERVER_ROUND] = server_round
        config[keys.GLOBAL_STEP] = self.history.global_step(server_round)
        self._identify(config)
        if self.fragments is not None:
            self.fragments.configure(config, server_round)
        if self.download is not None:
            self.download.prepare(self.outer.tensors())
        self.train_config = config
        record = self.history.at(server_round)
        record.sampled = len(targets)
        log.info("round %d: training %s", server_round, ", ".join(targets))
        messages, sent = self._messages(arrays, config, targets, MessageType.TRAIN)
        record.bytes_down += sent
        self.history.comm.bytes_down += sent
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's replies combined into the outer step (:mod:`.training_round`); what
        the round took is credited, the nodes that failed are let go."""
        round_replies = self._replies(server_round)
        versions = list(self.fragments.versions) if self.fragments else []  # what was sent
        accepted = train_round(self._round(server_round), round_replies, replies)
        self._close(round_replies)
        if self.download is not None:
            self.download.round_done(u.target.source for u in accepted or [])
        if accepted is None:
            return None, None
        if self.fragments is not None:
            self.fragments.stepped(server_round)
            for update in accepted:
                self.fragments.took(update.target.source, versions)
        self.reference = median_stats([u.spooled.stats for u in accepted]) or self.reference
        return self.shared_tensors(), round_replies.credit(accepted)

    def _round(self, server_round: int) -> Round:
        """What the round is combined from, besides its replies."""
        max_weight = largest_weight(self.outer) if self.settings.defences.reach else 0.0
        shapes = self._round_shapes(server_round)
        return Round(
            number=server_round,
            settings=self.settings,
            outer=self.outer,
            history=self.history,
            shapes=shapes,
            expected=functools.partial(self._expected, shapes),
            sampled=len(self.in_flight.sources()),
            spool=self._spool(server_round),
            units=self._units(server_round, max_weight),
            reference=self.reference,
            max_weight=max_weight,
        )

    def _spool(self, server_round: int) -> Path:
        if self.spool_dir is None:
            self._own_spool = tempfile.TemporaryDirectory(prefix="dept-spool-")
            self.spool_dir = Path(self._own_spool.name)
        return self.spool_dir / f"round-{server_round:04d}"

    def _units(self, server_round: int, max_weight: float) -> dict[str, float]:
        """What a synced fragment tensor's Δ may hold, in rounds of training: its span's
        reach over one round's (:class:`dept_strategy.screening.UpdateSizes`), for those
        that span more than this round; none without fragments or a finite reach."""
        reach = self.settings.defences.reach
        if self.fragments is None or reach is None:
            return {}
        one = reach(range(server_round, server_round + 1), max_weight)
        if not 0 < one < math.inf:
            return {}
        spans = self.fragments.spans(server_round)
        return {n: reach(s, max_weight) / one for n, s in spans.items() if len(s) > 1}

    def whole_body(self, reply: Message) -> Message | None:
        """For a train reply that asks for the whole body (its node does not hold the one
        the round's change applies to): the message that sends it, in place of the reply;
        None for any other reply, and for a second ask (then refused as a reply without
        an update)."""
        if reply.has_error() or keys.INFO not in reply.content.config_records:
            return None
        if not reply.content.config_records[keys.INFO].get(keys.NEEDS_BODY):
            return None
        target = self.in_flight.target_of(reply)
        if target is None or self.download is None or target.source not in self.download.holders:
            return None  # once a round, to a source sent a change: else a reply like any other
        if self.in_flight.claim(reply)[0] is None:  # a duplicate: the strategy says so
            return None
        log.info(
            "source %s does not hold the body the change applies to: sent whole", target.source
        )
        self.download.forget(target.source)
        targets = {target.source: target.node}
        messages, sent = self._messages(
            self.shared_tensors(), self.train_config, targets, MessageType.TRAIN
        )
        server_round = int(self.train_config[keys.SERVER_ROUND])  # type: ignore[arg-type]
        self.history.at(server_round).bytes_down += sent
        self.history.comm.bytes_down += sent
        return messages[0]

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # Every source is evaluated before training and after the last round, so the
        # before/after comparison always covers the same sources.
        everyone = server_round in (0, self.settings.num_server_rounds)
        fraction = 1.0 if everyone else self.settings.fraction_evaluate
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
        round_replies = self._replies(server_round)
        for reply in replies:
            target = round_replies.claim(reply)
            if target is None:
                continue
            metrics = round_replies.check_eval(reply, target)
            if metrics is not None:
                self.history.record_eval(server_round, target.source, metrics)
        self._close(round_replies)
        mean = self.history.mean_val_bpb(server_round)
        return None if math.isnan(mean) else MetricRecord({keys.VAL_BPB: mean})


def _rng_tuple(state: list[Any]) -> tuple[Any, ...]:
    """A ``random.Random`` state back from its JSON form (lists for tuples)."""
    version, internal, gauss = state
    return version, tuple(internal), gauss
