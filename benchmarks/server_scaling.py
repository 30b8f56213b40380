"""Does the server's aggregation scale? Time and peak memory against body size and replies.

    python -m benchmarks.server_scaling

Bodies are synthetic float32 tensors shaped like a Llama body (per layer: q, k, v, o, gate,
up, down and two norms) of about ``--sizes`` parameters; replies are the real
``Message``/``ArrayRecord`` objects the strategy receives (npy-serialised pseudo-gradients
with metrics and source). Each configuration runs in a fresh process, alone, so its peak
resident memory (``ru_maxrss``) is its own; the state it held before (θ in the outer
optimizer) is subtracted. Two paths:

- ``strategy``: ``DeptStrategy.aggregate_train`` given the replies in one list, as
  ``grid.send_and_receive`` would return them, so they are all in memory at once
  (measured where ``replies x body`` fits under ``--hold-limit-gb``); ``held by
  aggregation`` subtracts the messages' own bytes from the peak.
- ``streamed``: the same ``aggregate_train`` given the replies one at a time, as the
  ServerApp hands them over while it pulls them (``server_app/arrivals.py``): each is
  decoded, checked, spooled to disk (``--spool``) and dropped, for any number of replies;
  once all are in, the screened mean is read back one tensor at a time.
"""

from __future__ import annotations

import argparse
import gc
import math
import resource
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from benchmarks.measure import print_table, result_header, write_outputs
from dept import keys
from dept_strategy.inflight import Target
from dept_strategy.outer import OuterOptimizer
from dept_strategy.strategy import DeptStrategy

TARGET = 4.0
FLOAT32 = 4
WEIGHT = 1000  # tokens per reply


def body_shapes(params: float) -> dict[str, tuple[int, ...]]:
    """Llama-like body of about ``params`` parameters: ~12 h² per layer (MLP width 8h/3)."""
    layers = 12 if params >= 1e7 else 4
    hidden = max(64, round(math.sqrt(params / (12 * layers)) / 64) * 64)
    mlp = round(hidden * 8 / 3 / 64) * 64
    shapes: dict[str, tuple[int, ...]] = {"model.norm.weight": (hidden,)}
    for i in range(layers):
        prefix = f"model.layers.{i}"
        for proj in ("q", "k", "v", "o"):
            shapes[f"{prefix}.self_attn.{proj}_proj.weight"] = (hidden, hidden)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (mlp, hidden)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (mlp, hidden)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (hidden, mlp)
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
    return shapes


def rss_bytes() -> int:
    """Resident memory now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def make_instruction(node: int) -> Message:
    """A train instruction for ``node``, as the strategy sends it (no arrays needed here)."""
    instruction = Message(RecordDict({keys.CONFIG: ConfigRecord()}), node, "train")
    instruction.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # the SuperLink's job
    return instruction


def make_reply(instruction: Message, delta: dict[str, np.ndarray]) -> Message:
    """A training reply as a ClientApp sends it, to ``instruction``."""
    node = instruction.metadata.dst_node_id
    content = RecordDict(
        {
            keys.ARRAYS: ArrayRecord({k: Array(v) for k, v in delta.items()}),
            keys.METRICS: MetricRecord(
                {keys.NUM_EXAMPLES: WEIGHT, keys.TRAIN_LOSS: 2.0, keys.LOCAL_STEPS: 25}
            ),
            keys.INFO: ConfigRecord({keys.SOURCE: f"source-{node}"}),
        }
    )
    return Message(content, reply_to=instruction)


def aggregate(
    outer: OuterOptimizer, instructions: list[Message], replies: Iterable[Message], spool: Path
) -> None:
    """One round's aggregation and outer step, through ``DeptStrategy.aggregate_train``, for
    the replies to ``instructions`` (the strategy credits only replies to what it sent)."""
    strategy = DeptStrategy(outer=outer, local_steps=25, run_id="bench", spool_dir=spool)
    for message in instructions:
        node = message.metadata.dst_node_id
        strategy.in_flight.track(message, Target(node, f"source-{node}"))
    strategy.aggregate_train(1, replies)


def measure(params: float, replies: int, path: str, spool: Path) -> dict[str, Any]:
    """One configuration, in a fresh process: seconds and peak memory of the aggregation."""
    import torch

    torch.set_num_threads(1)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    # A first tiny round loads what the code path imports lazily, before the baseline.
    warm = {"w": np.zeros((16, 16), np.float32)}
    outer = OuterOptimizer({"w": torch.zeros(16, 16)}, kind="fedavg")
    first = make_instruction(1)
    aggregate(outer, [first], [make_reply(first, warm)], spool)
    shapes = body_shapes(params)
    rng = np.random.default_rng(0)
    outer = OuterOptimizer(
        {n: torch.from_numpy(rng.standard_normal(s, np.float32)) for n, s in shapes.items()},
        kind="fedavg",
    )
    delta = {n: rng.standard_normal(s, np.float32) * np.float32(1e-3) for n, s in shapes.items()}
    body_bytes = sum(math.prod(s) for s in shapes.values()) * FLOAT32
    instructions = [make_instruction(i + 1) for i in range(replies)]
    made: Iterator[Message] = (make_reply(m, delta) for m in instructions)
    gc.collect()
    before = rss_bytes()  # what the server held before the round's replies came in
    held: list[Message] = list(made) if path == "strategy" else []  # as Flower hands them
    started = time.perf_counter()
    aggregate(outer, instructions, held or made, spool)
    seconds = time.perf_counter() - started
    peak = peak_rss_bytes() - before
    message_bytes = sum(r.content.array_records[keys.ARRAYS].count_bytes() for r in held)
    return {
        "path": path,
        "body_params": body_bytes // FLOAT32,
        "replies": replies,
        "seconds": seconds,
        "seconds_per_reply": seconds / replies,
        "peak_bytes": peak,
        "peak_x_body": peak / body_bytes,
        "messages_x_body": message_bytes / body_bytes,
        "held_by_aggregation_x_body": (peak - message_bytes) / body_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plans = []
    for size in args.sizes:
        body_gb = sum(math.prod(s) for s in body_shapes(size).values()) * FLOAT32 / 1e9
        for replies in args.replies:
            plans.append((size, replies, "streamed"))
            if replies * body_gb <= args.hold_limit_gb:
                plans.append((size, replies, "strategy"))
    rows = []
    for size, replies, path in plans:  # one fresh process per configuration, one at a time
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            row = pool.submit(measure, size, replies, path, args.spool).result()
        print(
            f"{row['body_params'] / 1e6:.1f}M x {replies} {path}: {row['seconds']:.2f} s, "
            f"peak {row['peak_x_body']:.2f}x body",
            flush=True,
        )
        rows.append(row)
    result = summarise(args, rows)
    write_outputs(args.out, "server_scaling", result, rows)
    return 0


def summarise(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    table = print_table(
        "server aggregation: time and peak memory above the state held before "
        f"(in bodies of float32; target: the aggregator's peak <= {TARGET:g}x the body)",
        [
            "body params",
            "replies",
            "path",
            "s",
            "s/reply",
            "peak MB",
            "peak x body",
            "messages x body",
            "aggregation x body",
        ],
        [
            (
                f"{r['body_params'] / 1e6:.1f}M",
                r["replies"],
                r["path"],
                r["seconds"],
                r["seconds_per_reply"],
                r["peak_bytes"] / 1e6,
                r["peak_x_body"],
                r["messages_x_body"],
                r["held_by_aggregation_x_body"],
            )
            for r in rows
        ],
    )
    worst = max(r["held_by_aggregation_x_body"] for r in rows)
    worst_streamed = max(r["peak_x_body"] for r in rows if r["path"] == "streamed")
    return {
        **result_header("server_scaling", args, 1),
        "table": table,
        "target_x_body": TARGET,
        "worst_aggregation_x_body": worst,
        "worst_streamed_peak_x_body": worst_streamed,
        "met": worst <= TARGET,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    numbers = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--sizes", type=numbers, default=[1e6, 1e7, 1e8], help="body params")
    parser.add_argument(
        "--replies", type=lambda s: [int(x) for x in s.split(",")], default=[2, 8, 64]
    )
    parser.add_argument(
        "--hold-limit-gb", type=float, default=4.0, help="most replies' bytes held at once"
    )
    parser.add_argument("--quick", action="store_true", help="1M and 4M bodies, 2 and 4 replies")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/server-scaling"))
    parser.add_argument(
        "--spool",
        type=Path,
        default=Path("outputs/bench/server-scaling/spool"),
        help="where the round's replies wait on disk",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.replies = [1e6, 4e6], [2, 4]
    return args


if __name__ == "__main__":
    raise SystemExit(main())
