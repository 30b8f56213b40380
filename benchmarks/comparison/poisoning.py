"""One bad node against the body: poisoned pseudo-gradients, refused and named, or not.

    python -m benchmarks.comparison.poisoning

runs the same federation (four sources, the built-in default: the Python standard library
and three synthetic languages) once honestly and once per attack, in which one source's node
(``--culprit``) tampers with every training reply after its honest training:

- ``x1e3``, ``x1e6``: its pseudo-gradient scaled (well-formed, finite);
- ``to-max``: scaled until its largest value is 3.3e38, near the float32 limit (a float32
  sum of two such replies overflows);
- ``saturated``: every value ±3.3e38: only the signs of its update are left;
- ``int8-scale``: ``compression=int8``, its block scales × 1e30 (the codes are honest);
- ``fp16-max``: ``compression=fp16``, every value ±65504, fp16's largest;
- ``flip``: its update reversed, the same size, so no size check can see it; once
  combined by the weighted mean and once by ``--robust`` (trimmed mean by default).

Updates caught as too large are clipped to the round's median size (the default
``outlier-action``); ``x1e6/reject`` drops them instead, for comparison.

Every run goes through the real ServerApp and ClientApp in process
(:func:`dept_cli.in_process.federate_in_process`). The table has each run's average validation
bits per byte (all four sources, and the three honest ones), its change against the honest
run with the same combination rule, and what ``summary.json`` says of the culprit.
Writes ``poisoning.json``/``.csv``/``.txt`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, Context, Message, MessageType

from benchmarks.measure import common_arguments, print_table, result_header, write_outputs
from dept.config import DeptConfig, load_config, to_run_config
from dept.paths import resolve_path
from dept.wire import keys
from dept.wire.compression import SCALE_SUFFIX
from dept_cli.in_process import federate_in_process, in_process_grid

Tamper = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]  # payload -> what is sent
GROSS = ("x1e3", "x1e6", "to-max", "saturated", "int8-scale", "fp16-max")  # caught every round
NAMED = ("clipped", "rejected")  # what the summary calls a caught update


@dataclass(frozen=True)
class Attack:
    tamper: Tamper | None  # None: honest
    compression: str = "none"
    aggregation: str = "mean"
    outlier_action: str = "clip"


def _values(arrays: dict[str, np.ndarray]) -> list[str]:
    """The arrays holding update values (not int8's block scales)."""
    return [n for n in arrays if not n.endswith(SCALE_SUFFIX)]


def _scaled(factor: float) -> Tamper:
    return lambda a: {n: v * np.float32(factor) if n in _values(a) else v for n, v in a.items()}


def _to_max(limit: float) -> Tamper:
    def tamper(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        biggest = max(float(np.abs(arrays[n]).max()) for n in _values(arrays))
        return {
            n: (v.astype(np.float64) * (limit / biggest)).astype(v.dtype) for n, v in arrays.items()
        }

    return tamper


def _saturated(limit: float) -> Tamper:
    return lambda a: {n: np.where(v < 0, -limit, limit).astype(v.dtype) for n, v in a.items()}


def _int8_scales(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: v if n in _values(arrays) else v * np.float32(1e30) for n, v in arrays.items()}


def attacks(robust: str) -> dict[str, Attack]:
    return {
        "honest": Attack(None),
        "x1e3": Attack(_scaled(1e3)),
        "x1e6": Attack(_scaled(1e6)),
        "to-max": Attack(_to_max(3.3e38)),
        "saturated": Attack(_saturated(3.3e38)),
        "int8-scale": Attack(_int8_scales, compression="int8"),
        "fp16-max": Attack(_saturated(65504.0), compression="fp16"),
        "x1e6/reject": Attack(_scaled(1e6), outlier_action="reject"),
        "flip": Attack(_scaled(-1.0)),
        f"honest/{robust}": Attack(None, aggregation=robust),
        f"flip/{robust}": Attack(_scaled(-1.0), aggregation=robust),
    }


def poisoning(app: Callable[[Message, Context], Message], culprit: str, tamper: Tamper) -> Any:
    """``app`` whose training replies for source ``culprit`` are passed through ``tamper``
    (a bad node: its own training is honest, what it sends is not)."""

    def bad_node(msg: Message, context: Context) -> Message:
        reply = app(msg, context)
        config = msg.content.config_records.get(keys.CONFIG)
        if (
            msg.metadata.message_type == MessageType.TRAIN
            and config is not None
            and config.get(keys.SOURCE) == culprit
            and reply.has_content()
        ):
            arrays = reply.content.array_records[keys.ARRAYS]
            sent = {n: arrays[n].numpy() for n in arrays if n != keys.EMBEDDING_IDS}
            for name, value in tamper(sent).items():
                arrays[name] = Array(value)
        return reply

    return bad_node


def run_attack(base: DeptConfig, label: str, attack: Attack, culprit: str, work: Path) -> dict:
    out_dir = work / "runs" / label.replace("/", "-")
    shutil.rmtree(out_dir, ignore_errors=True)  # a fresh run, not a resume of an old one
    config = {
        **to_run_config(base),
        "compression": attack.compression,
        "aggregation": attack.aggregation,
        "outlier-action": attack.outlier_action,
        "output-dir": str(out_dir),
    }
    grid = in_process_grid(config)
    if attack.tamper is not None:
        grid.client_app = poisoning(grid.client_app, culprit, attack.tamper)
    started = time.perf_counter()
    summary = json.loads((federate_in_process(config, grid) / "summary.json").read_text())
    against = [p for p in summary["problems"] if p.get("source") == culprit]
    honest = [s["val_bpb"] for n, s in summary["sources"].items() if n != culprit]
    return {
        "attack": label,
        "aggregation": attack.aggregation,
        "outlier_action": attack.outlier_action,
        "compression": attack.compression,
        "wall_s": time.perf_counter() - started,
        "avg_val_bpb": summary["avg_val_bpb"],
        "honest_avg_val_bpb": sum(honest) / len(honest),
        "culprit_named_rounds": sorted({p["round"] for p in against if p["kind"] in NAMED}),
        "culprit_reason": against[0]["reason"] if against else "",
        "other_problems": len(summary["problems"]) - len(against),
        "culprit_tokens_credited": summary["sources"][culprit]["tokens_trained"],
        "sources": {n: s["val_bpb"] for n, s in summary["sources"].items()},
    }


def summarise(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    reference = {r["aggregation"]: r for r in rows if r["attack"].startswith("honest")}

    def change(r: dict[str, Any]) -> float:
        ref = reference[r["aggregation"]]["avg_val_bpb"]
        return 100 * (r["avg_val_bpb"] - ref) / ref

    table = print_table(
        f"one poisoned source ({args.culprit}) among four: average validation bits per byte "
        f"after {args.rounds} rounds x {args.local_steps} steps ({args.model})",
        [
            "attack",
            "combined by",
            "too large:",
            "avg bpb",
            "Δ vs honest %",
            "3 honest avg",
            "culprit bpb",
            "culprit caught in rounds",
            "its tokens credited",
            "why (round 1)",
        ],
        [
            (
                r["attack"],
                r["aggregation"],
                r["outlier_action"],
                r["avg_val_bpb"],
                change(r),
                r["honest_avg_val_bpb"],
                r["sources"][args.culprit],
                ", ".join(map(str, r["culprit_named_rounds"])) or "none",
                r["culprit_tokens_credited"],
                r["culprit_reason"][:48],
            )
            for r in rows
        ],
    )
    caught = [r for r in rows if r["attack"] in GROSS]
    return {
        **result_header("poisoning", args, None),
        "table": table,
        "worst_change_percent": max(abs(change(r)) for r in caught) if caught else math.nan,
        "every_gross_attack_named": all(r["culprit_named_rounds"] for r in caught),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = resolve_path(str(args.work))
    base = load_config(
        {
            "model": args.model,
            "num-server-rounds": args.rounds,
            "local-steps": args.local_steps,
            "warmup-steps": min(10, args.rounds * args.local_steps - 1),
            "eval-bytes": args.eval_bytes,
            "state-dir": str(work / "state"),
            "device": "cpu",
        }
    )
    rows = []
    for label, attack in attacks(args.robust).items():
        if args.attacks and label not in args.attacks:
            continue
        rows.append(run_attack(base, label, attack, args.culprit, work))
        print(
            f"{label}: avg val bpb {rows[-1]['avg_val_bpb']:.4f}, culprit caught in rounds "
            f"{rows[-1]['culprit_named_rounds']} ({rows[-1]['wall_s']:.0f} s)",
            flush=True,
        )
    write_outputs(args.out, "poisoning", summarise(args, rows), rows)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(parser, "poisoning", "debug model, 2 rounds x 4 steps")
    parser.add_argument("--culprit", default="synth-greek", help="the source that tampers")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-steps", type=int, default=25)
    parser.add_argument("--eval-bytes", type=int, default=32768)
    parser.add_argument("--robust", default="trimmed-mean", choices=["trimmed-mean", "median"])
    parser.add_argument(
        "--attacks", type=lambda s: s.split(","), default=None, help="a subset, by label"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.rounds, args.local_steps, args.eval_bytes = "debug", 2, 4, 4096
    return args


if __name__ == "__main__":
    raise SystemExit(main())
