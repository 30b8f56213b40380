"""The server's run: validate the config, build θ and the strategy, run the rounds, report.

Round 0 evaluates the untrained body with every source's fresh embeddings (the "before"
column); each round then trains, aggregates and evaluates, a line goes to ``metrics.jsonl``
and a checkpoint to ``checkpoints/`` before the next round starts. With ``resume`` the run
continues after the newest good checkpoint in ``output-dir``, with the same run id (so each
node finds its state) and the same sampling: it ends as the uninterrupted run would have.
:func:`run_federation` returns a :class:`RunResult`: the output folder and the summary.
"""

from __future__ import annotations

import functools
import logging
import math
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

from dept.config import DeptConfig, load_config, to_run_config
from dept.data.sources import run_sources
from dept.model.variants import variant
from dept.paths import resolve_path
from dept.state.lock import exclusive_folder
from dept.train.budget import check_server_fits, machine_memory, shared_vocab_size
from dept.train.local import max_span_update
from dept.train.sharing import initial_tensors
from dept_strategy.identity import load_source_keys
from dept_strategy.outer import OuterOptimizer
from dept_strategy.privacy import CentralPrivacy
from dept_strategy.screening import Defences
from dept_strategy.settings import StrategySettings
from dept_strategy.strategy import DeptStrategy
from server_app import nudges as nudging
from server_app.arrivals import replies_as_they_arrive
from server_app.checkpoint import (
    Checkpoint,
    check_same_run,
    load_latest,
    no_checkpoint,
    save_checkpoint,
)
from server_app.no_progress import dead_worker, nothing_trained, server_disk_full
from server_app.nudges import NodesBehind
from server_app.report import RunReport
from server_app.run_status import ERROR_LOG, write_failed, write_finished

log = logging.getLogger(__name__)
SPOOL_DIR = ".spool"  # a round's replies wait here until the round is combined


@dataclass(frozen=True)
class RunResult:
    """What a finished run hands back: where its files are, and its summary."""

    out_dir: Path
    # the content of out_dir/summary.json (a missing or non-finite number is None)
    summary: dict[str, Any]


def run_federation(grid: Grid, run_config: Mapping[str, Any]) -> RunResult:
    """Run every round; returns the output folder and the run's summary. Bad config fails
    before any training, and a second run on the same ``output-dir`` stops at once
    (:mod:`dept.state.lock`)."""
    cfg = load_config(run_config)
    declared = {s.name for s in run_sources(cfg)}  # parses and validates the sources file
    check_server_fits(cfg, shared_vocab_size(cfg), machine_memory())
    out_dir = resolve_path(cfg.output_dir)
    with exclusive_folder(out_dir):
        try:
            summary = _run_rounds(grid, cfg, out_dir, declared, in_simulation(grid))
        except Exception as exc:
            write_failed(out_dir, exc)
            exc.add_note(f"traceback in {out_dir / ERROR_LOG}")
            raise
        finally:
            shutil.rmtree(out_dir / SPOOL_DIR, ignore_errors=True)  # each round's is gone
        write_finished(out_dir)
    return RunResult(out_dir, summary)


def in_simulation(grid: Grid) -> bool:
    """Whether this is Flower's simulation runtime (its in-memory grid), where a slow node
    is one queued behind others on a client actor (:attr:`StrategySettings.simulation`)."""
    return isinstance(grid, InMemoryGrid)


def _run_rounds(
    grid: Grid, cfg: DeptConfig, out_dir: Path, declared: set[str], simulation: bool
) -> dict[str, Any]:
    """The rounds from the start (or after the checkpoint resumed); the run's summary."""
    log.info(
        "DEPT %s: model %s, %d rounds x %d local steps; output in %s",
        cfg.variant,
        cfg.model,
        cfg.num_server_rounds,
        cfg.local_steps,
        out_dir,
    )
    if cfg.warmup < cfg.warmup_steps:
        log.warning(
            "warmup-steps %d is longer than the run's %d steps: warming up %d",
            cfg.warmup_steps,
            cfg.total_steps,
            cfg.warmup,
        )
    shutil.rmtree(out_dir / SPOOL_DIR, ignore_errors=True)  # what a crashed run left
    build = functools.partial(_build_strategy, cfg, simulation=simulation)
    if cfg.resume:  # fails before any work
        strategy, checkpoint = _resume(cfg, out_dir, build)
    else:
        strategy, checkpoint = build(uuid.uuid4().hex[:12]), None
    strategy.summary()
    owners = strategy.wait_for_sources(grid)  # the nodes check their data first
    log.info("%d sources take part: %s", len(owners), ", ".join(sorted(owners)))
    if cfg.sources_file and (missing := sorted(declared - owners.keys())):
        log.warning("no node serves %s yet; a source joins when its node does", ", ".join(missing))
    # The report closes its trackers however the rounds end.
    with RunReport(out_dir, cfg, strategy.run_id, strategy.history if checkpoint else None) as r:
        return _rounds(grid, strategy, cfg, out_dir, checkpoint, r)


def _rounds(
    grid: Grid,
    strategy: DeptStrategy,
    cfg: DeptConfig,
    out_dir: Path,
    checkpoint: Checkpoint | None,
    report: RunReport,
) -> dict[str, Any]:
    """Round 0 (or the one after ``checkpoint``) to the last, each reported and
    checkpointed; the run's summary."""
    done = checkpoint.server_round if checkpoint else -1
    started = time.monotonic() - strategy.elapsed_s()  # a resumed run's clock goes on
    # Nothing is held back in the simulation runtime: no nudges (server_app/nudges.py).
    after_s = math.inf if strategy.settings.simulation else nudging.NUDGE_AFTER_S
    nudges = NodesBehind(strategy.run_id, strategy.directory.behind, after_s)
    exchanges = _Exchanges(grid, strategy, cfg.round_timeout_s, nudges)
    server_round, tries = done + 1, 0
    while server_round <= cfg.num_server_rounds:
        updated = exchanges.train(server_round) if server_round > 0 else None
        lost = strategy.history.at(server_round).rejected if server_round > 0 else []
        if full := server_disk_full(server_round, lost):
            raise full  # a round of the replies that fitted is not a round
        why = strategy.why_nothing_trained(server_round) if server_round > 0 else None
        if why is not None:  # no round: not evaluated nor checkpointed (server_app.no_progress)
            if died := dead_worker(server_round, strategy.history.at(server_round).failed):
                raise died  # trying again cannot help
            tries += 1
            if server_round == 1 or tries > cfg.empty_round_retries:
                raise nothing_trained(server_round, tries, why, cfg.empty_round_retries)
            log.warning(
                "round %d trained nothing (%s); the model is as it was, trying the round "
                "again (%d of %d)",
                server_round,
                why,
                tries,
                cfg.empty_round_retries,
            )
            strategy.try_again()
            continue
        tries = 0
        exchanges.evaluate(
            server_round, updated if updated is not None else strategy.shared_tensors()
        )
        del updated  # not held into the next round's training
        strategy.round_ended(server_round, time.monotonic() - started)
        report.round_done(strategy.history, server_round)
        tensors, state = strategy.state_dict()
        save_checkpoint(
            out_dir, server_round, tensors, {"run_config": to_run_config(cfg), "strategy": state}
        )
        if died := dead_worker(server_round, strategy.history.at(server_round).failed):
            raise died  # Flower does not replace it: its nodes would fail every later round
        server_round += 1
    body, embeddings = strategy.final_model()
    return report.finish(strategy.history, body, time.monotonic() - started, embeddings)


def _resume(
    cfg: DeptConfig, out_dir: Path, build: Callable[[str], DeptStrategy]
) -> tuple[DeptStrategy, Checkpoint]:
    """The strategy restored from the newest checkpoint that verifies and restores, after
    checking that the run config still matches it (a changed run is refused, not resumed)."""
    restored: list[DeptStrategy] = []

    def restore(checkpoint: Checkpoint) -> None:
        check_same_run(cfg, checkpoint.state["run_config"])
        strategy = build(str(checkpoint.state["strategy"]["run_id"]))
        strategy.resume(checkpoint.tensors, checkpoint.state["strategy"], checkpoint.server_round)
        restored.append(strategy)

    checkpoint = load_latest(out_dir, restore)
    if checkpoint is None:
        raise no_checkpoint(out_dir)
    strategy = restored[-1]
    log.info(
        "resuming run %s after round %d (%s)",
        strategy.run_id,
        checkpoint.server_round,
        checkpoint.path,
    )
    return strategy, checkpoint


def _build_strategy(cfg: DeptConfig, run_id: str, *, simulation: bool) -> DeptStrategy:
    tensors, embedding_names = initial_tensors(cfg)
    outer = OuterOptimizer(
        tensors, kind=cfg.outer_optimizer, lr=cfg.outer_lr, momentum=cfg.outer_momentum
    )
    pins = cfg.source_keys_file
    settings = StrategySettings.from_config(
        cfg,
        run_id=run_id,
        query_timeout_s=cfg.wait_for_nodes_s,
        max_tokens_per_round=cfg.step_cap * cfg.grad_accum_steps * cfg.batch_size * cfg.seq_len,
        embedding_names=embedding_names,
        trim=variant(cfg.variant).embeddings == "rows",
        spool_dir=resolve_path(cfg.output_dir) / SPOOL_DIR,
        defences=Defences.from_config(cfg, reach=functools.partial(max_span_update, cfg)),
        privacy=CentralPrivacy(cfg.dp_noise_multiplier, cfg.dp_clip_norm, cfg.dp_delta),
        pinned=load_source_keys(resolve_path(pins)) if pins else None,
        simulation=simulation,
    )
    return DeptStrategy(outer, settings)


@dataclass(frozen=True)
class _Exchanges:
    """A round's two exchanges with the nodes: one grid, one reply timeout, one set of
    nudges for nodes that hold a reply back (:mod:`server_app.nudges`)."""

    grid: Grid
    strategy: DeptStrategy
    timeout_s: float
    nudges: NodesBehind

    def train(self, server_round: int) -> ArrayRecord | None:
        """Train one round from the shared tensors as they are, serialised for its messages
        alone: no name here holds them or the messages, so they are let go once sent and the
        aggregation runs without them (4.9 GB at 1.3b). The shared tensors after the round,
        as the strategy serialised them, or None when it changed nothing."""
        replies = self._replies(
            self.strategy.configure_train(
                server_round, self.strategy.shared_tensors(), ConfigRecord(), self.grid
            ),
            follow_up=self.strategy.whole_body,
        )
        updated, _ = self.strategy.aggregate_train(server_round, replies)  # each added, dropped
        return updated

    def evaluate(self, server_round: int, shared: ArrayRecord) -> None:
        messages = self.strategy.configure_evaluate(server_round, shared, ConfigRecord(), self.grid)
        self.strategy.aggregate_evaluate(server_round, self._replies(messages))

    def _replies(
        self,
        messages: Iterable[Message],
        follow_up: Callable[[Message], Message | None] | None = None,
    ) -> Iterator[Message]:
        return replies_as_they_arrive(
            self.grid, messages, self.timeout_s, nudges=self.nudges, follow_up=follow_up
        )
