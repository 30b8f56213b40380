"""Every DEPT variant against the paper's baselines, on the same data, in one table.

Runs STD (τ = 0, 0.3, 1), ACT and every variant of :mod:`dept.model.variants` (GLOB, TRIM, SPEC,
SPEC-OPT) with the same model, seed, token budget, learning-rate schedule shape and evaluation
(bits per byte on the same bytes of each source's validation text), each at every learning
rate of one sweep, and writes to ``--out``: ``comparison.md`` (the table), ``comparison.json``
(the same numbers, plus every sweep run) and ``comparison.png`` (average bits per byte per
round, best rate per method).

Federated methods run the real ServerApp and ClientApp code in process (``LocalGrid``: one
node per source, every source trained every round); baselines run ``dept.train.baselines``. Runs
go to ``--jobs`` worker processes with the CPU threads split between them; a run that
crashes is reported in the table with its error, never dropped; every log line of a run
starts with its label (e.g. [spec-opt lr 0.004]) and goes to its runs/<method>-lr<rate>/run.log.
A comparison stopped part way resumes when run again with the same command: a run whose
folder holds a finished result of the same run config is reused, a federated run of the same
run config stopped part way goes on from its last checkpoint, any other is run afresh.

Vocabularies: STD, ACT, GLOB, TRIM and SPEC use one global tokenizer of --global-vocab-size;
SPEC-OPT trains each source its own of the source's vocab-size. A source whose entry gives
no vocab-size gets --global-vocab-size here (not dept run's default of 2048), so the methods
compare at one vocabulary size unless the sources file says otherwise; the sources file the
runs read is written to --out as compared-sources.yaml, and the table shows both sizes.

Budget: --budget tokens gives every method the same training tokens; --budget bytes the same
bytes of text (dept_cli.text_budget: SPEC-OPT, whose tokens hold more text, gets fewer rounds).
Any other run config key is set with -c, as for dept run; a key compare sets itself is
refused with the option that sets it.

This module holds the command and how one plan runs; :mod:`dept_cli.compare_plan` what runs,
:mod:`dept_cli.compare_resume` which finished runs are reused, :mod:`dept_cli.compare_pool`
the worker processes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from dept.cli_help import HelpFormatter, add_run_config_option, plain
from dept.config import ConfigError, check_device_name, load_config
from dept.data.sources import check_source_paths, run_sources
from dept.logs import log_to_terminal
from dept.model.outer_optimizers import OUTER_OPTIMIZERS
from dept.paths import resolve_path
from dept.state.jsonl import read_lines
from dept.state.strict_json import dumps
from dept_cli import compare_pool
from dept_cli.compare_plan import (
    COMPARED_SOURCES,
    Plan,
    base_config,
    make_plans,
    prepare,
    rounds_for,
)
from dept_cli.compare_resume import RESULT_FILE, finished_result, record_plan, stopped_after
from dept_cli.comparison_report import best_per_method, size_range, write_report
from dept_cli.in_process import federate_in_process
from dept_cli.methods import BASELINES, FEDERATED, METHODS
from dept_cli.run_logs import run_logging
from dept_cli.seeds import pool_seeds
from dept_cli.text_budget import BUDGETS

# What benchmarks and tests use of a comparison, besides the command (main).
__all__ = [
    "COMPARED_SOURCES",
    "Plan",
    "base_config",
    "build_parser",
    "main",
    "make_plans",
    "parse_args",
    "prepare",
    "rounds_for",
    "run_all",
    "run_plan",
]

log = logging.getLogger(__name__)
# On the nine corpora (tiny) 0.016 never won, and SPEC-OPT was best at 0.002.
DEFAULT_LRS = "0.002,0.004,0.008"
EPILOG = """how --tokens becomes rounds:
  every method trains num-server-rounds x --local-steps steps; a step takes --batch-size
  sequences of --seq-len tokens from each source (a federated round trains every source, an
  STD or ACT step takes batch-size x sources sequences from the mixture), so
    tokens per round  = sources x local-steps x batch-size x seq-len
    num-server-rounds = max(1, round(tokens / tokens per round))
  e.g. the 9 sources of benchmarks/corpora.yaml at the defaults: 9 x 40 x 4 x 64 = 92,160
  tokens per round, 550,000 / 92,160 = 5.97, so 6 rounds of 40 steps (240 steps, 552,960
  tokens per run). The first line compare prints gives the rounds it chose.
  With --budget bytes those are the rounds of the methods on the global tokenizer; each
  other method gets max(1, round(those rounds x their bytes per token / its bytes per token)).

examples:
  dept compare --sources-file benchmarks/corpora.yaml --model tiny   # ~45 min on 2 CPUs
  dept compare --sources-file my-sources.yaml --methods std-0.3,spec-opt --lrs 0.004 --jobs 4
  dept compare --sources-file my-sources.yaml --budget bytes -c "keep-inner-optimizer=false"
"""


def run_plan(plan: Plan) -> dict[str, Any]:
    """Run one plan (in a worker process); its normalised result, or its error."""
    import torch

    torch.set_num_threads(plan.threads)
    out = Path(plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    finished = finished_result(plan)
    if finished is not None:
        return finished
    resumed_after = stopped_after(plan)
    record_plan(plan)
    started = time.perf_counter()
    with run_logging(plan.label, out / "run.log"):
        try:
            if plan.method in FEDERATED:
                result = _run_federated(plan, resumed_after is not None)
            else:
                result = _run_baseline(plan)
        except Exception as exc:  # reported in the table, with the traceback in run.log
            log.exception("crashed")
            result = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
            traceback.print_exc(file=(out / "error.txt").open("w"))
    result.update(method=plan.method, lr=plan.lr)
    # a federated run's own clock, which goes on across the invocations that resumed it
    result.setdefault("wall_s", time.perf_counter() - started)
    if resumed_after is not None:
        result["resumed_after"] = resumed_after
    result.update(seed=plan.run_config["seed"])
    result.update(rounds=plan.run_config["num-server-rounds"])
    if "tokens" in result and math.isfinite(plan.bytes_per_token):
        result["text_bytes"] = round(result["tokens"] * plan.bytes_per_token)
    (out / RESULT_FILE).write_text(dumps(result, indent=2))
    return result


def _run_federated(plan: Plan, resume: bool) -> dict[str, Any]:
    out = federate_in_process({**plan.run_config, "resume": resume})
    summary = json.loads((out / "summary.json").read_text())
    rounds = read_lines(out / "metrics.jsonl")
    comm = summary["comm"]
    return {
        "sources": {
            name: {"val_bpb": s["val_bpb"], "val_ppl": s["val_ppl"]}
            for name, s in summary["sources"].items()
        },
        "curve": [(r["round"], r["avg_val_bpb"]) for r in rounds],
        "bytes": comm["bytes_up"] + comm["bytes_down"],
        "bytes_ddp": comm["bytes_ddp_equivalent"],
        "embedding_params": {n: s["embedding_params"] for n, s in summary["sources"].items()},
        "tokens": sum(s["tokens_trained"] for s in summary["sources"].values()),
        "failed": summary["failed_replies"] + summary["rejected_updates"],
        "wall_s": summary["wall_s"],
    }


def _run_baseline(plan: Plan) -> dict[str, Any]:
    from transformers import PreTrainedModel

    from dept.export import export_baseline
    from dept.train.baselines import BaselineRound, run_standard
    from dept_cli.evaluate import BASELINE_MODEL

    baseline = BASELINES[plan.method]
    cfg = load_config(plan.run_config)
    specs = run_sources(cfg)
    state_root = resolve_path(cfg.state_dir)

    def say(record: BaselineRound) -> None:
        log.info("round %d: avg val bpb %.4f", record.round, record.avg_val_bpb)

    def keep_final(record: BaselineRound, model: PreTrainedModel) -> None:
        """The last round's model, as a folder ``dept eval`` reads (before ACT forgets)."""
        if record.round == cfg.num_server_rounds:
            out = Path(plan.out_dir) / BASELINE_MODEL
            score = record.avg_val_bpb
            export_baseline(model, cfg, state_root, out, name=baseline.title, avg_bpb=score)

    run = run_standard(
        cfg,
        specs,
        state_root,
        temperature=baseline.temperature,
        sources_per_round=len(specs),
        forgets=baseline.forgets,
        on_round=say,
        on_model=keep_final,
    )
    final = run.rounds[-1].eval
    full_model = (run.body_params + run.embedding_params) * 4
    # Data-parallel: every step, each of the round's workers sends and receives a gradient.
    ddp = 2 * full_model * len(specs) * cfg.total_steps
    return {
        "sources": {
            name: {"val_bpb": r.bits_per_byte, "val_ppl": r.perplexity} for name, r in final.items()
        },
        "curve": [(r.round, r.avg_val_bpb) for r in run.rounds],
        "bytes": ddp,
        "bytes_ddp": ddp,
        "embedding_params": dict.fromkeys(final, run.embedding_params),
        "tokens": run.tokens_trained,
        "failed": 0,
    }


def run_all(plans: list[Plan], jobs: int) -> list[dict[str, Any]]:
    """Run every plan by :func:`run_plan`, ``jobs`` at a time; results in plan order."""
    return compare_pool.run_all(plans, jobs, run_plan)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_terminal()
    out = resolve_path(args.out)
    try:  # a bad value or sources file fails here, before any work
        base = base_config(args, out)
        specs = run_sources(base)
        check_source_paths(specs)
    except ConfigError as exc:
        print(f"dept compare: error: {exc}", file=sys.stderr)
        return 2
    tokens = base.num_server_rounds * len(specs) * base.local_steps * base.batch_size
    own = size_range(s.vocab_size for s in specs)
    print(
        f"{len(args.methods)} methods x {len(args.lrs)} learning rates x {args.seeds} seed(s) "
        f"on {len(specs)} sources, "
        f"model {base.model}: {base.num_server_rounds} rounds x {base.local_steps} local steps, "
        f"{tokens * base.seq_len:,} training tokens per run, {args.jobs} jobs; vocabularies: "
        f"global {base.global_vocab_size}, SPEC-OPT's own {own}",
        flush=True,
    )
    started = time.perf_counter()
    plans = make_plans(args, base, out, prepare(base), args.budget)
    if args.budget == "bytes":
        rounds = {p.method: p.run_config["num-server-rounds"] for p in plans}
        print(f"byte budget: rounds {rounds}", flush=True)
    results = run_all(plans, args.jobs)
    pooled = pool_seeds(results)
    best = best_per_method(pooled)
    wall_s = time.perf_counter() - started
    write_report(out, base, pooled, best, wall_s, args.budget, runs=results)
    print(f"wrote {out / 'comparison.md'}, comparison.json and comparison.png", flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    return args


def build_parser() -> argparse.ArgumentParser:
    """compare's options; its help shows each one's default and how --tokens becomes rounds."""
    parser = argparse.ArgumentParser(
        prog="dept compare",
        description=plain(__doc__),
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--sources-file", required=True, help="YAML list of sources (paths relative to its folder)"
    )
    parser.add_argument("--model", default="tiny", help="<family>:<size> (see dept models)")
    parser.add_argument(
        "--tokens",
        type=float,
        default=5.5e5,
        help="training tokens per run (all sources), rounded to whole rounds: see below",
    )
    parser.add_argument(
        "--budget",
        choices=BUDGETS,
        default="tokens",
        help="what every method gets the same of: training tokens, or bytes of text",
    )
    parser.add_argument("--local-steps", type=int, default=40, help="steps per round")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per source per step")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--warmup-steps", type=int, default=10, help="learning-rate warmup")
    parser.add_argument(
        "--global-vocab-size",
        type=int,
        default=4096,
        help="the global tokenizer's size; SPEC-OPT's too where a source gives no vocab-size",
    )
    parser.add_argument("--eval-bytes", type=int, default=12288, help="validation bytes per source")
    parser.add_argument(
        "--outer-optimizer", default="fedavg", choices=OUTER_OPTIMIZERS, help="the server's step"
    )
    parser.add_argument("--outer-lr", type=float, default=1.0, help="the outer optimizer's rate")
    parser.add_argument(
        "--outer-momentum", type=float, default=0.9, help="where the outer optimizer has one"
    )
    parser.add_argument(
        "--lrs",
        type=lambda s: [float(x) for x in s.split(",")],
        default=DEFAULT_LRS,
        help="comma-separated learning rates, the same sweep for every method",
    )
    parser.add_argument(
        "--methods",
        type=lambda s: s.split(","),
        default=",".join(METHODS),
        help="comma-separated subset of the methods",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, len(os.sched_getaffinity(0))),
        help="runs at once (the CPU threads are split between them)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="runs of each method and rate, with seeds --seed, --seed + 1, ...; the tables "
        "give the mean and the standard deviation of the average over them",
    )
    parser.add_argument("--seed", type=int, default=0, help="the same seed for every run")
    parser.add_argument(
        "--device",
        default="auto",
        type=check_device_name,
        help="where runs train: auto, cpu, cuda, cuda:N or mps",
    )
    parser.add_argument("--out", default="outputs/compare", help="folder for the results")
    add_run_config_option(
        parser,
        "run config overrides for every run, as for dept run (e.g. \"inner-optimizer='sgd'\" "
        "or act-period=10); not for the keys the options above set",
    )
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
