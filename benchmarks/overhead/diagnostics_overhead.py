"""What the per-round diagnostics add to the server's round: ``interference`` on against off.

    python -m benchmarks.overhead.diagnostics_overhead                  # tiny (glob) x 9, 350m x 4
    python -m benchmarks.overhead.diagnostics_overhead --plans tiny:9 125m:4

A plan is ``body:replies``; ``tiny`` is the real ``tiny`` model's shared tensors under GLOB
(θ and the whole φ, :func:`dept.train.sharing.initial_tensors`), ``125m``/``350m``/``1.3b`` the
paper's bodies in Llama form (θ only, :data:`benchmarks.overhead.server_scaling.PAPER_BODIES`).
Each plan runs one round through ``DeptStrategy.aggregate_train`` with the replies streamed,
interference off then on, ``--repeats`` times each in turn, in one process: the round's
seconds, and the seconds the diagnostics took in it (the update norms are taken either way;
the pairwise cosines only with interference on), measured inside the round; "added" is
that time over the round's with interference off. Side by side, so a loaded machine slows
both alike.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from flwr.supercore.task_identity import TaskIdentity

from benchmarks.measure import print_table, result_header, write_outputs
from benchmarks.overhead.server_scaling import (
    FLOAT32,
    PAPER_BODIES,
    aggregate,
    make_instruction,
    replies_for,
    server_state,
    shapes_of,
)
from dept.config import load_config
from dept.train.sharing import initial_tensors
from dept_strategy.settings import StrategySettings
from dept_strategy.strategy import DeptStrategy


def plan_shapes(body: str) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """(the shared tensors' shapes, which of them are φ) of a plan's body."""
    if body in PAPER_BODIES:
        return shapes_of(body), ()
    tensors, embedding_names = initial_tensors(load_config({"model": body, "variant": "glob"}))
    return {n: tuple(t.shape) for n, t in tensors.items()}, embedding_names


def one_round(
    shapes: dict[str, tuple[int, ...]], names: tuple[str, ...], replies: int, on: bool, spool: Path
) -> tuple[float, float]:
    """(the round's seconds, the diagnostics' seconds in it)."""
    settings = StrategySettings(
        run_id="diag", local_steps=25, spool_dir=spool, embedding_names=names, interference=on
    )
    strategy = DeptStrategy(server_state(shapes, "fedavg"), settings)
    instructions = [make_instruction(i + 1) for i in range(replies)]
    started = time.perf_counter()
    aggregate(strategy, instructions, replies_for(instructions, shapes, "mean"))
    return time.perf_counter() - started, strategy.history.rounds[1].diagnostics_s


def measure(body: str, replies: int, repeats: int, spool: Path) -> dict[str, Any]:
    shapes, names = plan_shapes(body)
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(repeats):
        for on in (False, True):
            runs[on].append(one_round(shapes, names, replies, on, spool))
    off_round = statistics.median(r for r, _ in runs[False])
    on_round = statistics.median(r for r, _ in runs[True])
    return {
        "body": body,
        "params": sum(math.prod(s) for s in shapes.values()),
        "body_mb": sum(math.prod(s) for s in shapes.values()) * FLOAT32 / 1e6,
        "replies": replies,
        "round_s_off": off_round,
        "round_s_on": on_round,
        "norms_s": statistics.median(d for _, d in runs[False]),
        "diagnostics_s": statistics.median(d for _, d in runs[True]),
        "added_fraction": statistics.median(d for _, d in runs[True]) / off_round,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    spool = args.spool or Path(tempfile.mkdtemp(prefix="dept-diag-bench-"))
    rows = []
    for body, replies in args.plans:
        row = measure(body, replies, args.repeats, spool)
        print(
            f"{body} x {replies}: round {row['round_s_off']:.2f} s off, {row['round_s_on']:.2f}"
            f" s on; diagnostics {row['diagnostics_s']:.3f} s",
            flush=True,
        )
        rows.append(row)
    table = print_table(
        "server seconds per round: interference off vs on (update norms in both)",
        ["body", "params", "replies", "round off", "round on", "norms", "norms + cosines", "added"],
        [
            (
                r["body"],
                f"{r['params'] / 1e6:.1f}M",
                r["replies"],
                r["round_s_off"],
                r["round_s_on"],
                r["norms_s"],
                r["diagnostics_s"],
                f"{100 * r['added_fraction']:+.0f}%",
            )
            for r in rows
        ],
    )
    result = {**result_header("diagnostics_overhead", args, None), "table": table}
    write_outputs(args.out, "diagnostics_overhead", result, rows)
    return 0


def _plan(text: str) -> tuple[str, int]:
    body, _, replies = text.partition(":")
    return body, int(replies or 4)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--plans", type=_plan, nargs="+", default=[("tiny", 9), ("350m", 4)], help="body:replies"
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds per setting")
    parser.add_argument("--spool", type=Path, default=None, help="where replies wait on disk")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/diagnostics-overhead"), help="results"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
