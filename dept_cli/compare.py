"""Every DEPT variant against the paper's baselines, on the same data, in one table.

Runs STD (τ = 0, 0.3, 1), ACT and every variant of :mod:`dept.variants` (GLOB, TRIM, SPEC,
SPEC-OPT) with the same model, seed, token budget, learning-rate schedule shape and evaluation
(bits per byte on the same bytes of each source's validation text), each at every learning
rate of one sweep, and writes to ``--out``: ``comparison.md`` (the table), ``comparison.json``
(the same numbers, plus every sweep run) and ``comparison.png`` (average bits per byte per
round, best rate per method).

Federated methods run the real ServerApp and ClientApp code in process (``LocalGrid``: one
node per source, every source trained every round); baselines run ``dept.baselines``. Runs
go to ``--jobs`` worker processes with the CPU threads split between them; a run that
crashes is reported in the table with its error, never dropped; every log line of a run
starts with its label (e.g. [spec-opt lr 0.004]) and goes to its runs/<method>-lr<rate>/run.log.
A comparison stopped part way resumes when run again with the same command: a run whose
folder holds a finished result of the same run config is reused, any other is run afresh.

Vocabularies: STD, ACT, GLOB, TRIM and SPEC use one global tokenizer of --global-vocab-size;
SPEC-OPT trains each source its own of the source's vocab-size. A source whose entry gives
no vocab-size gets --global-vocab-size here (not dept run's default of 2048), so the methods
compare at one vocabulary size unless the sources file says otherwise; the sources file the
runs read is written to --out as compared-sources.yaml, and the table shows both sizes.

Budget: --budget tokens gives every method the same training tokens; --budget bytes the same
bytes of text (dept_cli.text_budget: SPEC-OPT, whose tokens hold more text, gets fewer rounds).
Any other run config key is set with -c, as for dept run; a key compare sets itself is
refused with the option that sets it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from flwr.common.config import parse_config_args

from dept.cli_help import HelpFormatter, add_run_config_option, plain
from dept.config import (
    ConfigError,
    DeptConfig,
    check_device_name,
    load_config,
    resolve_path,
    to_run_config,
)
from dept.outer_optimizers import OUTER_OPTIMIZERS
from dept.sources import SourceSpec, check_source_paths, load_sources, run_sources, write_sources
from dept.variants import VARIANTS
from dept_cli.comparison_report import average_bpb, best_per_method, size_range, write_report
from dept_cli.in_process import federate_in_process
from dept_cli.methods import BASELINES, FEDERATED, METHODS, vocab_sizes
from dept_cli.run_logs import run_logging
from dept_cli.text_budget import BUDGETS, TextRates, stream_bytes_per_token
from server_app.report import dumps

log = logging.getLogger(__name__)
# On the nine corpora (tiny) 0.016 never won, and SPEC-OPT was best at 0.002.
DEFAULT_LRS = "0.002,0.004,0.008"
COMPARED_SOURCES = "compared-sources.yaml"  # in --out: the sources every run reads
PLAN_FILE = "plan.json"  # in a run's folder: the run config it ran with
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
# The run config keys compare sets itself, and the option (or fact) that sets each.
OWN_KEYS = {
    "sources-file": "--sources-file",
    "model": "--model",
    "num-server-rounds": "--tokens (and --budget)",
    "local-steps": "--local-steps",
    "batch-size": "--batch-size",
    "seq-len": "--seq-len",
    "warmup-steps": "--warmup-steps",
    "global-vocab-size": "--global-vocab-size",
    "eval-bytes": "--eval-bytes",
    "outer-optimizer": "--outer-optimizer",
    "outer-lr": "--outer-lr",
    "outer-momentum": "--outer-momentum",
    "fraction-train": "nothing: every source trains every round",
    "seed": "--seed",
    "device": "--device",
    "state-dir": "--out",
    "output-dir": "--out",
    "wait-for-nodes-s": "nothing: compare's nodes are in process",
    "lr": "--lrs",
    "variant": "--methods",
}


@dataclass(frozen=True)
class Plan:
    """One run: a method at one learning rate."""

    method: str
    lr: float
    run_config: dict[str, Any]
    out_dir: str
    threads: int
    vocab_sizes: dict[str, int]  # the tokenizer size each source trains with
    bytes_per_token: float = math.nan  # of text per training token (NaN: not measured)

    @property
    def global_vocab_size(self) -> int:
        return int(self.run_config["global-vocab-size"])

    @property
    def vocabularies(self) -> dict[str, Any]:
        """What its result reports of the vocabularies, crashed or not."""
        return {"global_vocab_size": self.global_vocab_size, "source_vocab_sizes": self.vocab_sizes}

    @property
    def label(self) -> str:
        return f"{self.method} lr {self.lr:g}"


def _exit_with_parent() -> None:
    """Worker initializer: stop when the comparison process is gone (killed, crashed), so no
    orphaned run keeps the CPUs busy."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(2.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def run_plan(plan: Plan) -> dict[str, Any]:
    """Run one plan (in a worker process); its normalised result, or its error."""
    import torch

    torch.set_num_threads(plan.threads)
    out = Path(plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    finished = finished_result(plan)
    if finished is not None:
        return finished
    (out / PLAN_FILE).write_text(dumps(plan.run_config, indent=2))
    started = time.perf_counter()
    with run_logging(plan.label, out / "run.log"):
        try:
            result = _run_federated(plan) if plan.method in FEDERATED else _run_baseline(plan)
        except Exception as exc:  # reported in the table, with the traceback in run.log
            log.exception("crashed")
            result = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
            traceback.print_exc(file=(out / "error.txt").open("w"))
    result.update(method=plan.method, lr=plan.lr, wall_s=time.perf_counter() - started)
    result.update(rounds=plan.run_config["num-server-rounds"])
    if "tokens" in result and math.isfinite(plan.bytes_per_token):
        result["text_bytes"] = round(result["tokens"] * plan.bytes_per_token)
    (out / "result.json").write_text(dumps(result, indent=2))
    return result


def finished_result(plan: Plan) -> dict[str, Any] | None:
    """The result an earlier comparison left in the plan's folder, if it ran this very plan
    (the same run config) to the end without an error: a comparison stopped part way (Ctrl-C,
    a reboot) picks up where it was by running the same command again."""
    out = Path(plan.out_dir)
    try:
        same_plan = json.loads((out / PLAN_FILE).read_text()) == json.loads(dumps(plan.run_config))
        result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        return None
    if not same_plan or "error" in result:
        return None
    log.info("%s: reusing the finished run in %s", plan.label, out)
    return result


def _run_federated(plan: Plan) -> dict[str, Any]:
    out = federate_in_process(plan.run_config)
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
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
    }


def _run_baseline(plan: Plan) -> dict[str, Any]:
    from dept.baselines import run_standard

    baseline = BASELINES[plan.method]
    cfg = load_config(plan.run_config)
    specs = run_sources(cfg)
    run = run_standard(
        cfg,
        specs,
        resolve_path(cfg.state_dir),
        temperature=baseline.temperature,
        sources_per_round=len(specs),
        forgets=baseline.forgets,
        on_round=lambda r: log.info("round %d: avg val bpb %.4f", r.round, r.avg_val_bpb),
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


def make_plans(
    args: argparse.Namespace,
    base: DeptConfig,
    out: Path,
    rates: TextRates | None = None,
    budget: str = "tokens",
) -> list[Plan]:
    """Every method at every rate (``args.methods``, ``args.lrs``), the CPU threads shared
    equally between the ``args.jobs``; with ``rates``, each run knows its bytes of text per
    token, and ``budget`` bytes sets its rounds from them (:class:`TextRates`)."""
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    specs = run_sources(base)
    if budget == "bytes" and rates is None:
        raise ValueError("--budget bytes needs the measured text rates (prepare)")
    per_round = len(specs) * base.local_steps * base.batch_size * base.seq_len
    plans = []
    for method in args.methods:
        rounds = base.num_server_rounds
        if rates is not None and budget == "bytes":
            rounds = rates.rounds(method, base.num_server_rounds, per_round)
        for lr in args.lrs:
            run_dir = out / "runs" / f"{method}-lr{lr:g}"
            config = {**to_run_config(base), "lr": lr, "output-dir": str(run_dir)}
            config["num-server-rounds"] = rounds
            if method in VARIANTS:  # a baseline reads no variant
                config["variant"] = method
            sizes = vocab_sizes(method, specs, base.global_vocab_size)
            rate = rates.bytes_per_token(method) if rates is not None else math.nan
            plans.append(Plan(method, lr, config, str(run_dir), threads, sizes, rate))
    return plans


def rounds_for(tokens: float, sources: int, local_steps: int, batch_size: int, seq_len: int) -> int:
    """The rounds that train closest to ``tokens`` (at least one): each trains every source
    ``local_steps`` steps of ``batch_size`` sequences of ``seq_len`` tokens (see EPILOG)."""
    return max(1, round(tokens / (sources * local_steps * batch_size * seq_len)))


def comparison_sources(sources_file: Path, global_vocab_size: int) -> list[SourceSpec]:
    """The sources of ``sources_file``, where an entry without a ``vocab-size`` gets the global
    one: with SourceSpec's default (2048) against a global 4096, SPEC-OPT started ahead in bits
    per byte at round 0, and the table showed the head start as a win."""
    return load_sources(sources_file, defaults={"vocab-size": global_vocab_size})


def base_config(args: argparse.Namespace, out: Path) -> DeptConfig:
    """The shared settings, reading the sources as :func:`comparison_sources` gives them
    (written to ``out/compared-sources.yaml``); rounds follow from the token budget."""
    specs = comparison_sources(resolve_path(args.sources_file), args.global_vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    sources_file = out / COMPARED_SOURCES
    write_sources(sources_file, specs)
    rounds = rounds_for(args.tokens, len(specs), args.local_steps, args.batch_size, args.seq_len)
    overrides = parse_config_args(args.run_config)
    own = sorted(k for k in overrides if k in OWN_KEYS)
    if own:
        raise ConfigError(
            "-c " + ", ".join(f"{k} is compare's own: use {OWN_KEYS[k]}" for k in own)
        )
    return load_config(
        {
            "sources-file": str(sources_file),
            "model": args.model,
            "num-server-rounds": rounds,
            "local-steps": args.local_steps,
            "batch-size": args.batch_size,
            "seq-len": args.seq_len,
            "warmup-steps": args.warmup_steps,  # clamped to a short run's steps by the config
            "global-vocab-size": args.global_vocab_size,
            "eval-bytes": args.eval_bytes,
            "outer-optimizer": args.outer_optimizer,
            "outer-lr": args.outer_lr,
            "outer-momentum": args.outer_momentum,
            "fraction-train": 1.0,
            "seed": args.seed,
            "device": args.device,
            "state-dir": str(out / "state"),
            "wait-for-nodes-s": 60.0,
        },
        overrides=overrides,
    )


def prepare(base: DeptConfig) -> TextRates:
    """Train every tokenizer and tokenize every source once, before the workers share them
    (two workers building the same cache would race): one variant per tokenizer kind, the
    sources' own or the run's global one (which the baselines use too). Returns what each
    kind's training tokens hold of text."""
    from dept.source_client import SourceClient
    from dept.workspace import Workspace

    specs = run_sources(base)
    root = resolve_path(base.state_dir)
    rates: dict[bool, dict[str, float]] = {}
    sizes: dict[str, int] = {}
    for own, variant in {v.own_tokenizer: v.name for v in VARIANTS.values()}.items():
        cfg = load_config({**to_run_config(base), "variant": variant})
        for spec in specs:
            log.info("preparing %s for %s", spec.name, variant)
            client = SourceClient(cfg, spec, Workspace(root, "prepare", spec.name), specs)
            train = client.tokens.train
            rates.setdefault(own, {})[spec.name] = stream_bytes_per_token(train, client.token_bytes)
            if not own:
                sizes[spec.name] = len(train)
    return TextRates(rates[False], rates[True], sizes)


def run_all(plans: list[Plan], jobs: int) -> list[dict[str, Any]]:
    """Run every plan, ``jobs`` at a time, printing progress; results in plan order."""
    results: dict[int, dict[str, Any]] = {}
    started = time.perf_counter()

    def done(i: int, result: dict[str, Any]) -> None:
        results[i] = result
        elapsed = time.perf_counter() - started
        eta = elapsed / len(results) * (len(plans) - len(results))
        outcome = result.get("error") or f"avg val bpb {average_bpb(result):.4f}"
        print(
            f"[{len(results)}/{len(plans)}] {plans[i].label}: {outcome} "
            f"({result['wall_s']:.0f} s; {elapsed / 60:.1f} min elapsed, ETA {eta / 60:.1f} min)",
            flush=True,
        )

    if jobs == 1:
        for i, plan in enumerate(plans):
            done(i, run_plan(plan))
    else:
        with ProcessPoolExecutor(
            jobs, mp_context=get_context("spawn"), initializer=_exit_with_parent
        ) as pool:
            futures: dict[Future, int] = {pool.submit(run_plan, p): i for i, p in enumerate(plans)}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    done(i, future.result())
                except Exception as exc:  # the worker itself died
                    done(i, {"error": f"{type(exc).__name__}: {exc}", "wall_s": 0.0})
    # From the plan, so a worker that died and returned nothing still says what it ran.
    return [
        {"method": p.method, "lr": p.lr, **p.vocabularies, **results[i]}
        for i, p in enumerate(plans)
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
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
        f"{len(args.methods)} methods x {len(args.lrs)} learning rates on {len(specs)} sources, "
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
    best = best_per_method(results)
    write_report(out, base, results, best, time.perf_counter() - started, args.budget)
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
        default=min(2, os.cpu_count() or 1),
        help="runs at once (the CPU threads are split between them)",
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
