"""What a run leaves behind: metrics per round, a summary, the final body, a plot, a table.

Files in ``output-dir``: ``config.json`` (the validated config), ``metrics.jsonl`` (one
object per round, written as the round ends), ``metrics.csv`` (one row per round and
source: the numbers of its ``sources``), ``summary.json``, ``body.safetensors`` (θ, and ψ
where shared), ``embeddings.safetensors`` (the global φ, GLOB and TRIM only) and
``val_bpb.png``, with ``drift.png`` and ``interference.png`` where the run measured them
(:mod:`server_app.diagnostics`), all with the mode the umask gives a new file.

A source none of whose replies counted (each failed or was refused) is in the summary and
the final table too, with the last reason; so is a node that never said what it serves.

Everything is read from the strategy's :class:`~dept_strategy.history.RunHistory`, which the
report never changes: a round's ``global_step`` there is the step at the start of its
training, its ``wall_s`` the run's wall time when it ended.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dept.config import DeptConfig, to_run_config
from dept.model.families import position_count
from dept.model.variants import variant
from dept.state.files import save_tensors
from dept.state.jsonl import append_line
from dept.state.strict_json import dumps, finite
from dept.wire import keys
from dept_strategy.history import RunHistory, source_row
from server_app.diagnostics import (
    DRIFT_PLOT,
    INTERFERENCE_PLOT,
    diagnostics_summary,
    plot_diagnostics,
)
from server_app.launch_clock import since_launch
from server_app.plots import save_line_plot
from server_app.run_status import ERROR_LOG, STATUS_FILE
from server_app.tracking import TENSORBOARD_DIR, Trackers

log = logging.getLogger(__name__)
FRESH_EVENT = "fresh "  # how a node's state event of a fresh start begins
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "metrics.csv",
    "summary.json",
    "body.safetensors",
    "embeddings.safetensors",
    "checkpoints",
    "val_bpb.png",
    DRIFT_PLOT,
    INTERFERENCE_PLOT,
    TENSORBOARD_DIR,
    STATUS_FILE,
    ERROR_LOG,
)


class RunReport:
    """Writes a run's outputs as it goes; :meth:`finish` adds the summary and the table.
    It only reads the history it is given. Used as a context manager, it also closes the
    trackers (:mod:`server_app.tracking`) of a run that fails."""

    def __init__(
        self, out_dir: Path, cfg: DeptConfig, run_id: str, resumed: RunHistory | None = None
    ) -> None:
        """A new run moves an earlier run's files aside; a resumed one (``resumed`` is its
        history up to the checkpoint) keeps them and rewrites ``metrics.jsonl`` to match."""
        self.out_dir, self.cfg, self.run_id = out_dir, cfg, run_id
        out_dir.mkdir(parents=True, exist_ok=True)
        if resumed is None:
            archive_previous_run(out_dir)
        (out_dir / "config.json").write_text(json.dumps(to_run_config(cfg), indent=2))
        self.metrics_path = out_dir / "metrics.jsonl"
        lines = (
            [dumps(resumed.round_json(r)) + "\n" for r in sorted(resumed.rounds)] if resumed else []
        )
        self.metrics_path.write_text("".join(lines))
        self.trackers = Trackers(
            cfg, out_dir, run_id, max(resumed.rounds, default=-1) if resumed else -1
        )

    def __enter__(self) -> RunReport:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.trackers.close(failed=exc is not None)  # nothing left to close after finish

    def round_done(self, history: RunHistory, server_round: int) -> None:
        """Append the line of ``server_round`` (ended, its wall time noted) and log it: the
        time elapsed since the ``dept run`` command where one started the run
        (:mod:`server_app.launch_clock`), else since the rounds began."""
        wall_s = history.rounds[server_round].wall_s
        line = history.round_json(server_round)
        append_line(self.metrics_path, dumps(line))  # whole, or not at all (a full disk)
        self.trackers.log(line)
        total = self.cfg.num_server_rounds
        eta = f"{wall_s / server_round * (total - server_round):.0f} s" if server_round else "–"
        evaluated = not math.isnan(line["avg_val_bpb"])  # if not, say what trained
        what, key = ("val bpb", "val_bpb") if evaluated else ("train loss", "train_loss")
        rows = {s: m[key] for s, m in line["sources"].items() if not math.isnan(m[key])}
        if evaluated:
            mean = line["avg_val_bpb"]
        else:
            mean = sum(rows.values()) / len(rows) if rows else math.nan
        per_source = ", ".join(f"{s} {v:.3f}" for s, v in rows.items()) or f"no {what}"
        privacy = line.get("privacy")
        spent = f"; ε {privacy['epsilon']:.3g} (δ {privacy['delta']:g})" if privacy else ""
        change = _average_change(history, server_round) if evaluated else ""
        log.info(
            "round %d/%d done: avg %s %.4f over %d source(s)%s [%s]%s; %.0f s elapsed, ETA %s",
            server_round,
            total,
            what,
            mean,
            len(rows),
            change,
            per_source,
            spent,
            since_launch() or wall_s,
            eta,
        )

    def finish(
        self,
        history: RunHistory,
        body: dict[str, torch.Tensor],
        wall_s: float,
        embeddings: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """Write the summary, the final model, the table and the plot; returns the summary
        as ``summary.json`` holds it (a missing or non-finite number is None)."""
        summary = {"run_id": self.run_id, **build_summary(history, self.cfg, wall_s)}
        (self.out_dir / "summary.json").write_text(dumps(summary, indent=2))
        save_tensors(body, self.out_dir / "body.safetensors")
        if embeddings:
            save_tensors(embeddings, self.out_dir / "embeddings.safetensors")
        self._write_csv(history)
        self._plot(history)
        plot_diagnostics(history, self.out_dir, f"DEPT {self.cfg.variant}, model {self.cfg.model}")
        log.info("\n%s", render_table(summary))
        if summary["problems"]:
            kinds = sorted({p["kind"] for p in summary["problems"]})
            log.warning(
                "%d problem(s) during the run (%s), each with its source, node and reason: see "
                "'problems' in %s",
                len(summary["problems"]),
                ", ".join(kinds),
                self.out_dir / "summary.json",
            )
        log.info("outputs written to %s", self.out_dir)
        self.trackers.close()
        return finite(summary)

    def _write_csv(self, history: RunHistory) -> None:
        """The ``sources`` of every ``metrics.jsonl`` line, a row each; an empty cell where
        a source had no such number that round (JSON's null)."""
        with (self.out_dir / "metrics.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["round", "source", *source_row({}, {})])
            for server_round in sorted(history.rounds):
                for source, m in history.round_json(server_round)["sources"].items():
                    cells = ("" if v is None else v for v in finite(list(m.values())))
                    writer.writerow([server_round, source, *cells])

    def _plot(self, history: RunHistory) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for source in history.sources():
            points = [
                (r, rec.eval[source][keys.VAL_BPB])
                for r, rec in sorted(history.rounds.items())
                if source in rec.eval
            ]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=source)
        averages = [(r, history.mean_val_bpb(r)) for r in sorted(history.rounds)]
        if any(math.isfinite(v) for _, v in averages):
            ax.plot(*zip(*averages, strict=True), "k--", linewidth=2, label="average")
        save_line_plot(
            fig,
            ax,
            self.out_dir / "val_bpb.png",
            xlabel="round (0 = before training)",
            ylabel="validation bits per byte",
            title=f"DEPT {self.cfg.variant}, model {self.cfg.model}",
        )


def archive_previous_run(out_dir: Path) -> Path | None:
    """Move an earlier run's files into ``previous/<time>/`` so a new run never overwrites them."""
    earlier = [out_dir / name for name in RUN_FILES if (out_dir / name).exists()]
    if not earlier:
        return None
    stamp = (
        time.strftime("%Y%m%d-%H%M%S", time.localtime((out_dir / "config.json").stat().st_mtime))
        if (out_dir / "config.json").exists()
        else time.strftime("%Y%m%d-%H%M%S")
    )
    target = out_dir / "previous" / stamp
    target.mkdir(parents=True, exist_ok=True)
    for path in earlier:
        path.replace(target / path.name)
    log.info("moved the earlier run's files in %s to %s", out_dir, target)
    return target


def _average_change(history: RunHistory, server_round: int) -> str:
    """How the sources of ``server_round``'s average differ from the last evaluated round's
    (a source that joined, or was not measured): its average then covers other sources and
    does not compare with that round's; "" where they are the same."""
    now = set(history.rounds[server_round].eval)
    before = next(
        (
            set(history.rounds[r].eval)
            for r in sorted(history.rounds, reverse=True)
            if r < server_round and history.rounds[r].eval
        ),
        None,
    )
    if before is None or before == now:
        return ""
    parts = [f"{', '.join(sorted(now - before))} joined" if now - before else ""]
    parts.append(f"{', '.join(sorted(before - now))} not measured" if before - now else "")
    said = "; ".join(p for p in parts if p)
    return f" ({said}: not comparable with the last average, over {len(before)})"


def build_summary(history: RunHistory, cfg: DeptConfig, wall_s: float) -> dict[str, Any]:
    """``summary.json``: final and initial per-source quality, tokens, embeddings, bytes;
    what failed for a source, and the nodes that never said what they serve."""
    names = sorted([*history.sources(), *history.never_succeeded()])
    sources = {name: _source_summary(history, name) for name in names}
    paired = {
        name: s
        for name, s in sources.items()
        if finite(s["val_bpb"]) is not None
        and finite(s["initial_val_bpb"]) is not None
        and s["evaluated_round"]
    }
    return {
        "variant": cfg.variant,
        "model": cfg.model,
        "rounds": max((r for r in history.rounds if history.rounds[r].train), default=0),
        "local_steps": cfg.local_steps,
        **_parameters_where_they_live(history, cfg),
        "sources": sources,
        # Averages over the sources measured both before and after, so they compare alike.
        "avg_val_bpb": _mean(s["val_bpb"] for s in paired.values()),
        "initial_avg_val_bpb": _mean(s["initial_val_bpb"] for s in paired.values()),
        "avg_val_bpb_sources": sorted(paired),
        "comm": history.comm.as_dict(),
        "rejected_updates": sum(len(r.rejected) for r in history.rounds.values()),
        "failed_replies": sum(len(r.failed) for r in history.rounds.values()),
        "unserved_nodes": history.unserved_nodes(),
        "problems": history.problems(),
        **({"privacy": history.privacy()} if history.privacy() else {}),
        "diagnostics": diagnostics_summary(history),
        "wall_s": round(wall_s, 2),
    }


def _source_summary(history: RunHistory, name: str) -> dict[str, Any]:
    """One source of ``summary.json``: NaN (null) and None where it never counted."""
    latest = history.latest_eval(name)
    final = latest[1] if latest else {}
    initial = history.rounds.get(0)
    failures = history.failures(name)
    return {
        "val_bpb": final.get(keys.VAL_BPB, math.nan),
        "val_ppl": final.get(keys.VAL_PPL, math.nan),
        "val_loss": final.get(keys.VAL_LOSS, math.nan),
        "evaluated_round": latest[0] if latest else None,
        # A source whose node joined the running federation first trained after round 1.
        "joined_round": min(
            (r for r, record in history.rounds.items() if name in record.train), default=None
        ),
        "initial_val_bpb": initial.eval.get(name, {}).get(keys.VAL_BPB, math.nan)
        if initial
        else math.nan,
        "oracle_bpb": history.oracle_bpb.get(name),
        "tokens_trained": history.tokens_trained(name),
        "embedding_params": history.embedding_params.get(name, 0),
        "failures": len(failures),  # its replies that failed or were refused
        "last_failure": failures[-1] if failures else None,
        "fresh_starts": fresh_starts(history, name),
    }


def fresh_starts(history: RunHistory, name: str) -> list[dict[str, Any]]:
    """The rounds in which source ``name`` started its state afresh after its first one
    (its saved state lost or damaged, as its node reported: :meth:`SourceClient.state_event`
    begins such an event with "fresh"), with the node's reason."""
    return [
        {"round": r, "event": e["event"]}
        for r, record in sorted(history.rounds.items())
        for e in record.state_events
        if e.get("source") == name and str(e.get("event", "")).startswith(FRESH_EVENT)
    ]


def _parameters_where_they_live(history: RunHistory, cfg: DeptConfig) -> dict[str, Any]:
    """θ's size, and ψ's with where it lives: shared (with θ, through the server) or kept by
    each source (counted in its ``embedding_params``); a model without learned positions has
    ``{"params": 0, "where": None}``."""
    positions = position_count(cfg.model, cfg.seq_len)
    shared = variant(cfg.variant).shares_positions
    where = ("shared" if shared else "each source") if positions else None
    return {
        "body_params": history.body_params - (positions if shared else 0),
        "positions": {"params": positions, "where": where},
    }


def _mean(values: Any) -> float:
    finite = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def render_table(summary: dict[str, Any]) -> str:
    """The end-of-run table: bits per byte before/after per source, then communication;
    under it, why a source trained in no round, and the nodes that served none."""
    table = Table(title=f"DEPT {summary['variant']} — validation bits per byte")
    for column in ("source", "before", "after", "best possible", "tokens", "embedding params"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for name, s in summary["sources"].items():
        table.add_row(
            name,
            _number(s["initial_val_bpb"], ".3f"),
            _number(s["val_bpb"], ".3f"),
            _number(s["oracle_bpb"], ".3f"),
            f"{s['tokens_trained']:,}",
            f"{s['embedding_params']:,}",
        )
    covered = summary.get("avg_val_bpb_sources", list(summary["sources"]))
    left_out = [n for n in summary["sources"] if n not in covered]
    table.add_row(
        f"average ({len(covered)} of {len(summary['sources'])})" if left_out else "average",
        _number(summary["initial_avg_val_bpb"], ".3f"),
        _number(summary["avg_val_bpb"], ".3f"),
        "",
        "",
        "",
        end_section=True,
    )
    comm = summary["comm"]
    comm_table = Table(title=f"communication (body: {summary['body_params']:,} parameters)")
    for column in (
        "bytes up",
        "bytes down",
        "FedAvg full model",
        "data-parallel per step",
        "reduction vs DDP",
    ):
        comm_table.add_column(column, justify="right")
    comm_table.add_row(
        _mb(comm["bytes_up"]),
        _mb(comm["bytes_down"]),
        _mb(comm["bytes_full_model_fedavg"]),
        _mb(comm["bytes_ddp_equivalent"]),
        f"{comm['reduction_vs_ddp']:.1f}x",
    )
    buffer = io.StringIO()
    console = Console(width=110, file=buffer)
    console.print(table)
    if left_out:  # the average's sources, said where they are not all of them
        console.print(Text(_left_out_note(summary, left_out)))
    for note in _failure_notes(summary):
        console.print(Text(note))  # Text: a reason's brackets are not rich markup
    console.print(comm_table)
    return buffer.getvalue()


def _left_out_note(summary: dict[str, Any], left_out: list[str]) -> str:
    """Which sources the averages leave out and why: a joiner has no figure from before
    training, a source not measured at the end none from after."""
    why = []
    for name in left_out:
        s = summary["sources"][name]
        if s["joined_round"] and _number(s["initial_val_bpb"], ".3f") == "–":
            why.append(f"{name} (joined in round {s['joined_round']}: no figure before training)")
        else:
            why.append(f"{name} (not measured both before and after)")
    return "the averages are over the sources measured before and after; left out: " + ", ".join(
        why
    )


def _failure_notes(summary: dict[str, Any]) -> list[str]:
    """Why a source trained in no round (its last failure), and the nodes that never said
    which sources they serve."""
    notes = [
        f"{name}: {'none of its replies' if s['evaluated_round'] is None else 'no update'} "
        f"counted ({s['failures']} failed or refused); last: {s['last_failure']}"
        for name, s in summary["sources"].items()
        if s["last_failure"] and not s["tokens_trained"]
    ]
    notes += [
        f"node {node} (its sources unknown): {why}"
        for node, why in summary["unserved_nodes"].items()
    ]
    return notes


def _number(value: float | None, spec: str) -> str:
    """``value`` formatted, or a dash where there is none (None, NaN)."""
    return format(value, spec) if value is not None and math.isfinite(value) else "–"


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"
