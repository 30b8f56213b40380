"""Downstream tasks on the bodies a comparison ends with (issue #31), the paper's protocol:
each body gets a fresh classification head and is fine-tuned with it on a task's train split,
then scored on its test split, several seeds each.

    python -m benchmarks.corpora build-tasks outputs/tasks --sources-file benchmarks/corpora.yaml
    python -m benchmarks.comparison.downstream --tasks outputs/tasks \\
        --run glob=outputs/compare/runs/glob-lr0.004 \\
        --run trim=outputs/compare/runs/trim-lr0.002 \\
        --run spec=outputs/compare/runs/spec-lr0.002 \\
        --run std-0.3=outputs/compare/runs/std-0.3-lr0.004

Which model stands for a body (``--run LABEL=DIR``, a ``dept compare`` run folder):

- STD and ACT: the model the run saved (``model/``);
- GLOB and TRIM: the global model, θ with the server's φ and the global tokenizer;
- SPEC and SPEC-OPT, which have no global embeddings: continued pre-training (CPT, as the
  paper does before its downstream tasks) gives the body fresh embeddings for the global
  tokenizer, trained with it for ``--cpt-steps`` on the run's sources (the τ = 0.3 mixture, at
  the run's learning rate); the tokens this adds are reported beside the pre-training's.

Every model is fine-tuned the same way (``dept finetune``'s :func:`dept_cli.finetune.finetune`,
settings below), on every task of ``--tasks`` (each a folder of train/test JSONL), with the
seeds ``--seed`` ... ``--seed + --seeds - 1``. Writes ``downstream.json`` (every seed's score),
``downstream.csv``, ``downstream.txt`` (mean ± standard deviation per body and task, and the
mean over tasks) and ``downstream.png`` to ``--out``; progress lines give an ETA.

A stopped comparison resumes when run again: each fine-tuning's row is kept under ``--work``
with what made it (the body's folder, the model's making, the task's data, the settings) and
reused only where all of these match, and a CPT model is reused where its run and steps do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.measure import print_table, result_header, write_outputs
from dept.config import ConfigError, DeptConfig, load_config, to_run_config
from dept.data.sources import run_sources
from dept.export import export_global, export_trained, load_run, state_root
from dept.logs import log_to_terminal
from dept.model.variants import variant
from dept.paths import resolve_path
from dept.state.workspace import global_tokenizer
from dept.train.devices import resolve_device
from dept_cli.compare_resume import PLAN_FILE, RESULT_FILE
from dept_cli.evaluate import BASELINE_MODEL
from dept_cli.finetune import Task, Tuning, finetune, load_task

log = logging.getLogger("downstream")
CPT_TEMPERATURE = 0.3  # the mixture the best STD trained on


@dataclass(frozen=True)
class Body:
    label: str
    run_dir: Path


@dataclass(frozen=True)
class Prepared:
    """The model folder that stands for a body, and how it was made."""

    body: Body
    folder: Path
    made: str
    extra_tokens: int  # CPT's training tokens (0: none)
    pretrain_tokens: int
    seq_len: int


def prepare(body: Body, work: Path, cpt_steps: int) -> Prepared:
    """The model to fine-tune for ``body`` (exported or continued-pre-trained under ``work``)."""
    run_dir = body.run_dir
    result = json.loads((run_dir / RESULT_FILE).read_text())
    if "error" in result:
        raise ConfigError(f"{run_dir} crashed ({result['error']}): no body to fine-tune")
    tokens = int(result.get("tokens", 0))
    if (run_dir / BASELINE_MODEL / "config.json").is_file():
        cfg = load_config(json.loads((run_dir / PLAN_FILE).read_text()))
        return Prepared(body, run_dir / BASELINE_MODEL, "the run's model", 0, tokens, cfg.seq_len)
    if not (run_dir / "summary.json").is_file():
        raise ConfigError(
            f"{run_dir} holds neither a baseline's {BASELINE_MODEL}/ nor a finished federated "
            "run's summary.json (a baseline run before models were saved must run again)"
        )
    run = load_run(run_dir)
    folder = work / "models" / body.label
    if variant(run.cfg.variant).shares_embeddings:
        export_global(run_dir, folder, force=True)
        return Prepared(body, folder, "the global model", 0, tokens, run.cfg.seq_len)
    made = f"CPT: fresh global-tokenizer embeddings, {cpt_steps} steps"
    marker = folder / "cpt.json"
    wanted = {"run_dir": str(run_dir), "cpt_steps": cpt_steps}
    done = json.loads(marker.read_text()) if marker.is_file() else {}
    if {k: done.get(k) for k in wanted} == wanted and (folder / "config.json").is_file():
        extra = int(done["tokens"])  # made by an earlier invocation
    else:
        extra = continued_pretraining(run.cfg, run.body, folder, cpt_steps, body.label)
        marker.write_text(json.dumps({**wanted, "tokens": extra}))
    return Prepared(body, folder, made, extra, tokens, run.cfg.seq_len)


def continued_pretraining(cfg: DeptConfig, body: dict, out: Path, steps: int, label: str) -> int:
    """Give ``body`` fresh embeddings for the run's global tokenizer, train both for ``steps``
    on the run's sources (τ = 0.3) and save the model to ``out``; the tokens it trained on."""
    from transformers import PreTrainedModel

    from dept.train.baselines import BaselineRound, run_standard

    every = min(steps, cfg.local_steps)
    cpt_cfg = load_config(
        {**to_run_config(cfg), "num-server-rounds": max(1, steps // every), "local-steps": every}
    )
    specs = run_sources(cpt_cfg)
    root = state_root(cpt_cfg)

    def say(record: BaselineRound) -> None:
        log.info("%s CPT step %d: avg val bpb %.4f", label, record.global_step, record.avg_val_bpb)

    tokenizer = global_tokenizer(specs, cpt_cfg.global_vocab_size, root / "cache", cpt_cfg.seed)
    how = f"by continued pre-training of the {label} body on its run's sources (τ = 0.3)"

    def keep_final(record: BaselineRound, model: PreTrainedModel) -> None:
        if record.round == cpt_cfg.num_server_rounds:
            name, score = f"{label} + CPT", record.avg_val_bpb
            export_trained(model, cpt_cfg, tokenizer, out, name=name, how=how, avg_bpb=score)

    run = run_standard(
        cpt_cfg,
        specs,
        root,
        temperature=CPT_TEMPERATURE,
        sources_per_round=len(specs),
        on_round=say,
        on_model=keep_final,
        body=body,
        name=f"{label} CPT",
    )
    return run.tokens_trained


def _row_key(model: Prepared, task: Task, seed: int, tuning: Tuning) -> str:
    """What a fine-tuning's row depends on, as a digest: a kept row is reused only where
    this is the same."""
    data = json.dumps([task.train, task.test], sort_keys=True).encode()
    made = {
        "run_dir": str(model.body.run_dir),
        "made": model.made,
        "task": task.name,
        "data": hashlib.sha256(data).hexdigest(),
        "seed": seed,
        "tuning": [str(v) for v in vars(tuning).values()],
    }
    return hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()


def fine_tune_all(
    prepared: list[Prepared], tasks: list[Task], seeds: range, tuning: Tuning, work: Path
) -> list[dict[str, Any]]:
    """Every model on every task with every seed; one row per (model, task, seed), each
    kept under ``work/rows`` and reused by a later invocation where nothing it depends on
    changed."""
    rows = []
    total, started = len(prepared) * len(tasks) * len(seeds), time.perf_counter()
    kept = work / "rows"
    kept.mkdir(parents=True, exist_ok=True)
    reused = 0
    for model in prepared:
        for task in tasks:
            for seed in seeds:
                key = _row_key(model, task, seed, tuning)
                path = kept / f"{key}.json"
                if path.is_file():
                    rows.append(json.loads(path.read_text()))
                    reused += 1
                    continue
                began = time.perf_counter()
                scores = finetune(model.folder, task, seed, tuning, model.body.label)
                rows.append(
                    {
                        "body": model.body.label,
                        "task": task.name,
                        "metric": task.metric,
                        "seed": seed,
                        "score": scores[task.metric],
                        "train_loss": scores["train_loss"],
                        "seconds": time.perf_counter() - began,
                    }
                )
                path.write_text(json.dumps(rows[-1]))
                elapsed = time.perf_counter() - started
                print(
                    f"[{len(rows)}/{total}] {model.body.label} on {task.name}, seed {seed}: "
                    f"{task.metric} {scores[task.metric]:.4f} ({elapsed / 60:.1f} min elapsed, "
                    f"ETA {elapsed / (len(rows) - reused) * (total - len(rows)) / 60:.1f} min)",
                    flush=True,
                )
    return rows


def summarise(
    args: argparse.Namespace, prepared: list[Prepared], tasks: list[Task], rows: list[dict]
) -> dict[str, Any]:
    """Mean and standard deviation (over seeds) per body and task, and over tasks."""
    cells: dict[str, dict[str, dict[str, float]]] = {}
    for model in prepared:
        label = model.body.label
        cells[label] = {}
        for task in tasks:
            scores = [r["score"] for r in rows if r["body"] == label and r["task"] == task.name]
            cells[label][task.name] = {
                "mean": float(np.mean(scores)),
                "sd": float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0,
            }
        # the mean over tasks of each seed's scores, then its spread over seeds
        per_seed = [
            np.mean([r["score"] for r in rows if r["body"] == label and r["seed"] == seed])
            for seed in sorted({r["seed"] for r in rows})
        ]
        cells[label]["mean over tasks"] = {
            "mean": float(np.mean(per_seed)),
            "sd": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0,
        }
    columns = [*(t.name for t in tasks), "mean over tasks"]
    table = print_table(
        f"downstream: {args.seeds} seeds, {args.epochs} epochs at lr {args.lr:g}, mean ± sd",
        ["body", "model", *columns],
        [
            (
                m.body.label,
                m.made,
                *(
                    f"{cells[m.body.label][c]['mean']:.4f} ± {cells[m.body.label][c]['sd']:.4f}"
                    for c in columns
                ),
            )
            for m in prepared
        ],
    )
    named = {
        "run": [f"{b.label}={b.run_dir}" for b in args.run],
        "task_dirs": [str(p) for p in args.task_dirs],
    }
    return {
        **result_header("downstream", argparse.Namespace(**{**vars(args), **named}), args.threads),
        "table": table,
        "cells": cells,
        "models": [
            {
                "body": m.body.label,
                "run_dir": str(m.body.run_dir),
                "made": m.made,
                "pretrain_tokens": m.pretrain_tokens,
                "cpt_tokens": m.extra_tokens,
            }
            for m in prepared
        ],
        "tasks": {
            t.name: {"metric": t.metric, "train": len(t.train), "test": len(t.test)} for t in tasks
        },
    }


def plot(out: Path, result: dict[str, Any]) -> None:
    """Grouped bars: each task's mean score per body, the seeds' spread as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    bodies, tasks = list(cells), list(next(iter(cells.values())))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(bodies)
    for i, label in enumerate(bodies):
        xs = np.arange(len(tasks)) + i * width
        means = [cells[label][t]["mean"] for t in tasks]
        spreads = [cells[label][t]["sd"] for t in tasks]
        ax.bar(xs, means, width, yerr=spreads, capsize=3, label=label)
    ax.set_xticks(np.arange(len(tasks)) + width * (len(bodies) - 1) / 2, tasks)
    ax.set_ylabel("test score (accuracy or Pearson r)")
    ax.set_title("downstream, fine-tuned")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "downstream.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_terminal()
    torch.set_num_threads(args.threads)
    tasks = [load_task(folder) for folder in args.task_dirs]  # checked before any training
    out, work = resolve_path(args.out), resolve_path(args.work)
    prepared = [prepare(body, work, args.cpt_steps) for body in args.run]
    tuning = Tuning(
        args.epochs,
        args.lr,
        args.batch_size,
        args.max_length or max(p.seq_len for p in prepared),
        args.pair_separator,
        resolve_device(args.device),
    )
    seeds = range(args.seed, args.seed + args.seeds)
    rows = fine_tune_all(prepared, tasks, seeds, tuning, work)
    result = summarise(args, prepared, tasks, rows)
    write_outputs(out, "downstream", result, rows)
    plot(out, result)
    return 0


def _body(text: str) -> Body:
    label, _, folder = text.partition("=")
    path = resolve_path(folder)
    if not label or not folder or not (path / RESULT_FILE).is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected LABEL=DIR, DIR a dept compare run folder (with result.json)"
        )
    return Body(label, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.comparison.downstream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", type=_body, action="append", required=True, help="LABEL=DIR")
    parser.add_argument("--tasks", type=Path, required=True, help="a build-tasks folder")
    parser.add_argument("--cpt-steps", type=int, default=100, help="SPEC, SPEC-OPT")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--max-length",
        type=int,
        default=128,
        help="tokens per example (0: the runs' seq-len); the pair tasks' two ~100-byte chunks "
        "take 71 tokens (median) of the nine corpora's global tokenizer, 87 at the 90th "
        "percentile: 64 would cut 70%% of them",
    )
    parser.add_argument("--pair-separator", default="\n")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads: more than the free cores slows every step (20x seen on 2 busy ones)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/downstream"))
    parser.add_argument("--work", type=Path, default=Path("outputs/bench/downstream"))
    args = parser.parse_args(argv)
    folders = sorted(p.parent for p in resolve_path(args.tasks).glob("*/train.jsonl"))
    if not folders:
        parser.error(f"--tasks {args.tasks}: no task folder (*/train.jsonl) in it")
    args.task_dirs = folders
    return args


if __name__ == "__main__":
    raise SystemExit(main())
