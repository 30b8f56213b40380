"""Time budgets for uneven nodes: two sources, one slowed on purpose, fixed steps against a
per-round time budget.

    python -m benchmarks.comparison.time_budget

Two arms, through the real ServerApp and ClientApp in process (a grid that times every
message), everything else equal:

- ``fixed``: every source trains ``local-steps`` a round; the second node sleeps
  ``--step-delay-s`` after each step (its ``step-delay-s`` node-config key), so it is slower;
- ``budget``: ``round-time-s`` (default: the fast node's median training seconds in the fixed
  arm, so it keeps its pace) capped at ``max-local-steps`` (default 2 x local-steps): the slow
  node trains the steps that fit.

Per round and source: steps, tokens, training seconds and the node's seconds (message in to
reply out). A round's wall time is its slowest node's, what a federation whose nodes train
at once waits for; the in-process grid serves the nodes one after another, so it is computed
from the nodes' times, not clocked. Then the final bits per byte, per source and on average.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch
from flwr.app import MessageType

from benchmarks.comparison.compression import prepare
from benchmarks.measure import (
    common_arguments,
    corpora_run_config,
    parse_quick,
    print_table,
    result_header,
    write_outputs,
)
from benchmarks.timed_grid import TimedGrid
from dept.config import load_config
from dept.data.sources import run_sources
from dept.wire import keys
from dept_cli.in_process import federate_in_process

DEFAULT_SOURCES = "en-shakespeare,de-novels"
SHARED_KEYS = ("model", "local_steps", "batch_size", "seq_len", "eval_bytes")  # from the CLI


def run_config(args: argparse.Namespace, arm: str, **budget: Any) -> dict[str, Any]:
    """The run config of ``arm``: the arms share sources, model, schedule and node state."""
    same = {key: getattr(args, key) for key in SHARED_KEYS}
    out = str(args.work / arm)
    return corpora_run_config(
        args.sources.split(","),
        args.work,
        num_server_rounds=args.rounds,
        output_dir=out,
        **same,
        **budget,
    )


def run_arm(args: argparse.Namespace, arm: str, config: dict[str, Any]) -> dict[str, Any]:
    """One federation, the second node slowed; its per-round rows and final scores."""
    from client_app.app import app as client_app

    nodes: list[dict[str, Any]] = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    nodes[1]["step-delay-s"] = args.step_delay_s
    slowed = run_sources(load_config(config))[1].name
    grid = TimedGrid(client_app, nodes, config)
    out = federate_in_process(config, grid)
    rows = [
        {
            "arm": arm,
            "round": d.server_round,
            "source": d.source,
            "slowed": d.source == slowed,
            "steps": int(d.metrics[keys.LOCAL_STEPS]),
            "tokens": int(d.metrics[keys.NUM_EXAMPLES]),
            "train_s": float(d.metrics[keys.TRAIN_SECONDS]),
            "node_s": d.seconds,
        }
        for d in grid.deliveries
        if d.message_type == MessageType.TRAIN
    ]
    summary = json.loads((out / "summary.json").read_text())
    bpb = {name: s["val_bpb"] for name, s in summary["sources"].items()}
    return {"rows": rows, "avg_val_bpb": summary["avg_val_bpb"], "val_bpb": bpb}


def round_walls(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Each round's wall time with the nodes training at once: its slowest node's."""
    walls: dict[int, float] = {}
    for row in rows:
        walls[row["round"]] = max(walls.get(row["round"], 0.0), row["node_s"])
    return walls


def summarise(args: argparse.Namespace, arms: dict[str, dict], seconds: float) -> dict[str, Any]:
    """The two tables (per source, per arm) and the figures behind them."""
    per_source, per_arm = [], []
    for arm, found in arms.items():
        rows = found["rows"]
        for source in sorted({r["source"] for r in rows}):
            mine = [r for r in rows if r["source"] == source]
            per_source.append(
                (
                    arm,
                    source + (" (slowed)" if mine[0]["slowed"] else ""),
                    "/".join(str(r["steps"]) for r in mine),
                    sum(r["tokens"] for r in mine),
                    statistics.mean(r["train_s"] for r in mine),
                    statistics.mean(r["node_s"] for r in mine),
                    found["val_bpb"][source],
                )
            )
        walls = round_walls(rows)
        found["round_wall_s"] = walls
        per_arm.append(
            (arm, statistics.mean(walls.values()), sum(walls.values()), found["avg_val_bpb"])
        )
    title = (
        f"time budget: {args.model}, {args.sources}, {args.rounds} rounds x {args.local_steps} "
        f"local steps, slowed node +{args.step_delay_s:g} s a step; budget arm: round-time-s "
        f"{seconds:.2f}, max-local-steps {args.max_local_steps}"
    )
    table = print_table(
        title,
        ["arm", "source", "steps by round", "tokens", "train s/round", "node s/round", "val bpb"],
        per_source,
    )
    table += print_table(
        "rounds with the nodes training at once (a round waits for its slowest node)",
        ["arm", "round wall s (mean)", "all rounds s", "avg val bpb"],
        per_arm,
    )
    return {
        **result_header("time_budget", args, args.threads),
        "table": table,
        "round_time_s": seconds,
        "arms": {
            arm: {k: v for k, v in found.items() if k != "rows"} for arm, found in arms.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    fixed_config = run_config(args, "fixed")
    base = load_config(fixed_config)
    prepare(base, run_sources(base))  # tokenizers and tokens once, in neither arm's time
    arms = {"fixed": run_arm(args, "fixed", fixed_config)}
    fast = [r["train_s"] for r in arms["fixed"]["rows"] if not r["slowed"]]
    seconds = args.round_time_s or statistics.median(fast)
    budget = {"round_time_s": seconds, "max_local_steps": args.max_local_steps}
    arms["budget"] = run_arm(args, "budget", run_config(args, "budget", **budget))
    result = summarise(args, arms, seconds)
    write_outputs(args.out, "time_budget", result, [r for a in arms.values() for r in a["rows"]])
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default=DEFAULT_SOURCES, help="two sources of corpora.yaml")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--local-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--eval-bytes", type=int, default=16384)
    parser.add_argument("--step-delay-s", type=float, default=0.3, help="the slowed node's")
    parser.add_argument(
        "--round-time-s", type=float, default=0.0, help="0: the fast node's fixed-arm median"
    )
    parser.add_argument("--max-local-steps", type=int, default=0, help="0: 2 x local steps")
    common_arguments(parser, "time-budget", "debug model, 2 rounds of 6 steps")
    quick = {"model": "debug", "rounds": 2, "local_steps": 6, "eval_bytes": 4096}
    args = parse_quick(parser, argv, seq_len=16, step_delay_s=0.2, **quick)
    if len(args.sources.split(",")) != 2:
        parser.error("--sources takes two sources: the second node is the slowed one")
    args.max_local_steps = args.max_local_steps or 2 * args.local_steps
    return args


if __name__ == "__main__":
    raise SystemExit(main())
