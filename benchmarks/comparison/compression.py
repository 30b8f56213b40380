"""Pseudo-gradient compression: bytes sent up against bits per byte, on the same run.

    python -m benchmarks.comparison.compression

runs one federation per setting — compression ``none``, ``fp16``, ``int8``, ``int8`` without
error feedback, ``int4``, ``int2``, ``ternary`` and ``topk`` at densities 0.1 and 0.01, and
any of them with partial synchronisation (``<setting>+frag-KxF``: ``fragments`` K,
``fragment-period`` F, e.g. ``int8+frag-4x2``) — with everything else equal (sources, seed,
model, schedule, variant), through the real ServerApp and ClientApp in process
(:func:`dept_cli.in_process.federate_in_process`), one after another in this process. Bytes
are what the replies' and train messages' ArrayRecords hold (``summary.json`` ``comm``). Writes
``compression.md`` (the tables), ``compression.json`` (the same numbers, per round),
``compression.csv`` (one row per setting) and
``compression.png`` (average bits per byte per round) to ``--out``. ``--quick`` is a
seconds-long smoke run on two built-in synthetic sources with the ``debug`` model.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from flwr.common.config import parse_config_args

from benchmarks.measure import parse_quick, plot_lines
from dept.cli_help import add_run_config_option
from dept.config import ConfigError, DeptConfig, load_config, to_run_config
from dept.data.sources import SourceSpec, check_source_paths, load_sources, write_sources
from dept.logs import log_to_terminal
from dept.paths import resolve_path
from dept.state.strict_json import dumps
from dept.wire.compression import TOPK_DENSITY
from dept_cli.in_process import federate_in_process

log = logging.getLogger("compression")
SETTINGS = {  # label: (compression, error feedback, topk density)
    "none": ("none", False, TOPK_DENSITY),
    "fp16": ("fp16", True, TOPK_DENSITY),
    "int8": ("int8", True, TOPK_DENSITY),
    "int8-no-ef": ("int8", False, TOPK_DENSITY),
    "int4": ("int4", True, TOPK_DENSITY),
    "int2": ("int2", True, TOPK_DENSITY),
    "ternary": ("ternary", True, TOPK_DENSITY),
    "topk-0.1": ("topk", True, 0.1),
    "topk-0.01": ("topk", True, 0.01),
}
DEFAULT_SOURCES = "code-python,de-novels,ru-chekhov,zh-techdoc"
QUICK_SOURCES = "synth-latin,synth-greek"
# the run config keys each setting sets: -c may not set them for every run
SETTING_KEYS = (
    "compression",
    "compression-error-feedback",
    "topk-density",
    "fragments",
    "fragment-period",
    "output-dir",
)
SETTING_FILE = "setting.json"  # in a run's folder, once it finished: its config and result
FRAGMENTS = "+frag-"  # "<setting>+frag-KxF": that setting with K fragments synced every F rounds


def split_label(label: str) -> tuple[str, int, int]:
    """(codec setting, fragments, fragment period) of a ``--settings`` label."""
    codec, _, fragments = label.partition(FRAGMENTS)
    if not fragments:
        return codec, 1, 1
    count, _, period = fragments.partition("x")
    if codec not in SETTINGS or not (count.isdigit() and period.isdigit()):
        raise ValueError(f"setting {label!r}: expected <setting>{FRAGMENTS}KxF, e.g. int8+frag-4x2")
    return codec, int(count), int(period)


def pick_sources(args: argparse.Namespace) -> list[SourceSpec]:
    """The ``--sources`` (in that order) from the sources file, or the built-ins (quick)."""
    available = {
        s.name: s for s in load_sources(None if args.quick else resolve_path(args.sources_file))
    }
    names = args.sources.split(",")
    unknown = [n for n in names if n not in available]
    if unknown:
        raise SystemExit(f"unknown source(s) {', '.join(unknown)}; known: {', '.join(available)}")
    return [available[n] for n in names]


def base_config(args: argparse.Namespace, sources_file: Path, work: Path) -> DeptConfig:
    """The settings every run shares (the options, then ``-c``); only the compression keys
    differ between runs."""
    overrides = parse_config_args(args.run_config)
    if taken := sorted(k for k in overrides if k in SETTING_KEYS):
        raise ConfigError(f"-c {', '.join(taken)}: set by each --settings label, not for all")
    return load_config(
        {
            "sources-file": str(sources_file),
            "variant": args.variant,
            "model": args.model,
            "num-server-rounds": args.rounds,
            "local-steps": args.local_steps,
            "batch-size": args.batch_size,
            "seq-len": args.seq_len,
            "lr": args.lr,
            "warmup-steps": min(args.warmup_steps, args.rounds * args.local_steps - 1),
            "global-vocab-size": args.global_vocab_size,
            "eval-bytes": args.eval_bytes,
            "seed": args.seed,
            "device": args.device,
            "state-dir": str(work / "state"),
            "wait-for-nodes-s": 60.0,
        },
        overrides=overrides,
    )


def prepare(base: DeptConfig, specs: list[SourceSpec]) -> None:
    """Train the tokenizers and tokenize once, so no run's wall time includes it."""
    from dept.state.workspace import Workspace
    from dept.train.source_client import SourceClient

    root = resolve_path(base.state_dir)
    for spec in specs:
        log.info("preparing %s", spec.name)
        SourceClient(base, spec, Workspace(root, "prepare", spec.name), specs)


def run_setting(base: DeptConfig, label: str, work: Path) -> dict[str, Any]:
    """One federation with the setting ``label``; its bytes and bits per byte. A run that
    finished before with the same run config (its ``SETTING_FILE``) is reused, so a stopped
    benchmark goes on where it was when the same command runs again."""
    codec, fragments, period = split_label(label)
    compression, feedback, density = SETTINGS[codec]
    out_dir = work / "runs" / label
    config = {
        **to_run_config(base),
        "compression": compression,
        "compression-error-feedback": feedback,
        "topk-density": density,
        "fragments": fragments,
        "fragment-period": period,
        "output-dir": str(out_dir),
    }
    if (done := finished_setting(out_dir, config)) is not None:
        log.info("%s: reusing the finished run in %s", label, out_dir)
        return done
    shutil.rmtree(out_dir, ignore_errors=True)  # a fresh run, not a resume of an old one
    started = time.perf_counter()
    out = federate_in_process(config)
    wall_s = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    comm = summary["comm"]
    result = {
        "setting": label,
        "compression": compression,
        "error_feedback": feedback,
        "topk_density": density if compression == "topk" else None,
        "fragments": fragments,
        "fragment_period": period,
        "wall_s": wall_s,
        "bytes_up": comm["bytes_up"],
        "bytes_down": comm["bytes_down"],
        "bytes_up_per_round": [r["bytes_up"] for r in rounds if r["round"] > 0],
        "bytes_down_per_round": [r["bytes_down"] for r in rounds if r["round"] > 0],
        "reduction_vs_ddp": comm["reduction_vs_ddp"],
        "avg_val_bpb": summary["avg_val_bpb"],
        "initial_avg_val_bpb": summary["initial_avg_val_bpb"],
        "sources": {n: s["val_bpb"] for n, s in summary["sources"].items()},
        "curve": [[r["round"], r["avg_val_bpb"]] for r in rounds],
        "dropped": summary["rejected_updates"] + summary["failed_replies"],
    }
    (out / SETTING_FILE).write_text(dumps({"config": config, "result": result}, indent=2))
    return result


def finished_setting(out_dir: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The result a run of this very ``config`` left in ``out_dir``, if it finished."""
    try:
        done = json.loads((out_dir / SETTING_FILE).read_text())
    except (OSError, ValueError):
        return None
    return done["result"] if done["config"] == json.loads(dumps(config)) else None


def markdown(results: list[dict[str, Any]], base: DeptConfig, command: str) -> str:
    """The summary table and the per-source table, each against the ``none`` run."""
    ref = next(r for r in results if r["setting"] == "none")
    lines = [
        "# Pseudo-gradient compression",
        "",
        f"`{command}`",
        "",
        f"{base.variant}, model {base.model}, {len(ref['sources'])} sources, "
        f"{base.num_server_rounds} rounds x {base.local_steps} local steps (batch "
        f"{base.batch_size} x {base.seq_len} tokens), lr {base.lr:g}, weight decay "
        f"{base.weight_decay:g}, inner optimizer {'kept' if base.keep_inner_optimizer else 'reset'}"
        f" across rounds, outer {base.outer_optimizer} (lr {base.outer_lr:g}, momentum "
        f"{base.outer_momentum:g}), seed {base.seed}; every source trains every round; with "
        "fragments the last round syncs them all. Bytes up: the replies' payloads (ArrayRecord "
        "bytes); bytes down: the train messages' (θ as float32; with fragments only what changed).",
        "",
        "| setting | bytes up / round | bytes down / round | bytes up, total | x fewer up "
        "than none | x fewer down | reduction vs DDP (up + down) | avg val bpb | Δ bpb vs none "
        "| wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {_per_round(r, 'up'):,.0f} | {_per_round(r, 'down'):,.0f} | "
            f"{r['bytes_up']:,} | {ref['bytes_up'] / r['bytes_up']:.2f} | "
            f"{ref['bytes_down'] / r['bytes_down']:.2f} | {r['reduction_vs_ddp']:.0f} | "
            f"{r['avg_val_bpb']:.4f} | {r['avg_val_bpb'] - ref['avg_val_bpb']:+.5f} | "
            f"{r['wall_s']:.0f} |"
        )
    names = list(ref["sources"])
    lines += [
        "",
        "Final validation bits per byte per source (Δ vs none in brackets):",
        "",
        f"| setting | {' | '.join(names)} |",
        f"|---|{'---:|' * len(names)}",
    ]
    for r in results:
        cells = [
            f"{r['sources'][n]:.4f} ({r['sources'][n] - ref['sources'][n]:+.5f})" for n in names
        ]
        lines.append(f"| {r['setting']} | {' | '.join(cells)} |")
    dropped = sum(r["dropped"] for r in results)
    lines += ["", f"Rejected or failed replies over all runs: {dropped}.", ""]
    return "\n".join(lines)


def _per_round(run: dict[str, Any], way: str) -> float:
    values = run[f"bytes_{way}_per_round"]
    return sum(values) / max(1, len(values))


def write_csv(results: list[dict[str, Any]], path: Path) -> None:
    """One row per setting: its bytes per round each way and its final bits per byte."""
    columns = ["setting", "compression", "error_feedback", "topk_density", "fragments"]
    columns += ["fragment_period", "bytes_up", "bytes_down", "avg_val_bpb", "wall_s"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*columns, "bytes_up_per_round", "bytes_down_per_round"])
        for r in results:
            writer.writerow([r[c] for c in columns] + [_per_round(r, "up"), _per_round(r, "down")])


def plot(results: list[dict[str, Any]], path: Path) -> None:
    lines = [
        (
            f"{r['setting']} ({r['bytes_up'] / 1e6:.1f} MB up)",
            [point[0] for point in r["curve"]],
            [point[1] for point in r["curve"]],
        )
        for r in results
    ]
    plot_lines(path, lines, xlabel="round", ylabel="average validation bits per byte")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_terminal()
    out, work = resolve_path(args.out), resolve_path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    specs = pick_sources(args)
    check_source_paths(specs)
    write_sources(work / "sources.yaml", specs)
    base = base_config(args, work / "sources.yaml", work)  # a bad value fails here
    started = time.perf_counter()
    prepare(base, specs)
    results = []
    for label in args.settings:
        results.append(run_setting(base, label, work))
        print(
            f"{label}: {results[-1]['bytes_up']:,} bytes up, avg val bpb "
            f"{results[-1]['avg_val_bpb']:.4f} ({results[-1]['wall_s']:.0f} s)",
            flush=True,
        )
    command = "python -m benchmarks.comparison.compression " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    table = markdown(results, base, command.strip())
    (out / "compression.md").write_text(table)
    report = {"config": to_run_config(base), "wall_s": time.perf_counter() - started}
    (out / "compression.json").write_text(dumps({**report, "runs": results}, indent=2))
    write_csv(results, out / "compression.csv")
    plot(results, out / "compression.png")
    print(table, flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources-file", default="benchmarks/corpora.yaml")
    parser.add_argument("--sources", default=None, help=f"comma-separated ({DEFAULT_SOURCES})")
    parser.add_argument("--variant", default="spec-opt")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--local-steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--global-vocab-size", type=int, default=4096)
    parser.add_argument("--eval-bytes", type=int, default=12288)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--settings",
        type=lambda s: s.split(","),
        default=list(SETTINGS),
        help=f"comma-separated subset of {','.join(SETTINGS)} (none is the reference), each "
        f"maybe with {FRAGMENTS}KxF (K fragments, each synced every F rounds)",
    )
    parser.add_argument("--out", default="benchmarks/results/compression")
    parser.add_argument("--work", default="outputs/compression", help="runs and node state")
    add_run_config_option(
        parser,
        "run config overrides for every run, as for dept run (e.g. \"outer-optimizer='nesterov' "
        'outer-lr=0.7"); not the compression or fragment keys the settings vary',
    )
    parser.add_argument(
        "--quick", action="store_true", help="debug model, 2 synthetic sources, 2 short rounds"
    )
    quick = {"model": "debug", "rounds": 2, "local_steps": 4, "eval_bytes": 4096}
    args = parse_quick(parser, argv, global_vocab_size=600, warmup_steps=2, **quick)
    args.sources = args.sources or (QUICK_SOURCES if args.quick else DEFAULT_SOURCES)
    unknown = sorted(s for s in args.settings if split_label(s)[0] not in SETTINGS)
    if unknown or "none" not in args.settings:
        parser.error(
            f"--settings must include none and come from {', '.join(SETTINGS)}, each maybe "
            f"with {FRAGMENTS}KxF"
        )
    return args


if __name__ == "__main__":
    raise SystemExit(main())
