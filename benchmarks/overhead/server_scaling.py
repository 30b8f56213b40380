"""Does the server's aggregation scale? Time and peak memory against body size and replies.

    python -m benchmarks.overhead.server_scaling            # 1M-100M bodies, 2-64 replies
    python -m benchmarks.overhead.server_scaling --paper    # 350m x 16 and 1.3b x 4 replies
    python -m benchmarks.overhead.server_scaling --paper --outer nesterov --server-memory lean

Bodies are float32 tensors shaped like a Llama body (per layer: q, k, v, o, gate, up, down
and two norms): of about ``--sizes`` parameters, or the paper's 350m and 1.3b shapes
(``--bodies``, :data:`PAPER_BODIES`). Replies are the real ``Message``/``ArrayRecord``
objects the strategy receives (npy-serialised pseudo-gradients with metrics and source).
Each configuration runs in a fresh process, alone; its peak resident memory (``VmHWM``,
reset once the body, the outer optimizer's state and the instructions exist) is measured
above what it held then, so the figures are what the round adds. Two paths:

- ``streamed``: ``DeptStrategy.aggregate_train`` given the replies one at a time, as the
  ServerApp hands them over while it pulls them (``server_app/arrivals.py``); each reply
  is made only when the strategy asks for the next one, so at most the one being read
  exists unless the strategy keeps it;
- ``streamed``, ``server-memory=lean`` (``--server-memory``): the mean folded from the
  spool once the last reply is in, not as each arrives;
- ``strategy``: the same given the replies in one list, as ``grid.send_and_receive``
  would return them, so they are all in memory before the round starts (``held x body``,
  part of the state before; measured where it fits under ``--hold-limit-gb``).

Modes (``--modes``): ``mean``; ``mean-clipped``, where the last reply is 1000x too large,
so the screening clips it and the mean is refolded from the spool; ``median`` and
``trimmed-mean``, which read every reply back from the spool. ``traced x body`` is the
peak of what Python and NumPy allocated during the round (``tracemalloc``: deterministic,
blind to torch's own allocations such as the outer step's temporaries). Each row is judged
traced against its memory's :data:`TARGETS` and resident against #34's goal for the server,
``peak <= 0.1 x state (θ, the outer state) + 1 body``.
"""

from __future__ import annotations

import argparse
import gc
import math
import time
import tracemalloc
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
from benchmarks.overhead.process_memory import available_gb, peak_rss_bytes, reset_peak, rss_bytes
from dept.model.outer_optimizers import OUTER_OPTIMIZERS
from dept.wire import keys
from dept_strategy.inflight import Target
from dept_strategy.outer import OuterOptimizer
from dept_strategy.screening import Defences
from dept_strategy.settings import StrategySettings
from dept_strategy.strategy import DeptStrategy

# Traced bodies a round may add, per server-memory: fast holds a sum and the reply being read,
# lean one of them at a time.
TARGETS = {"fast": 2.0, "lean": 1.0}
TEMPORARIES = 0.1  # per-tensor temporaries allowed on top, in bodies
BASELINE_GB = 1.0  # Python, torch and Flower in the measuring process
# The share of the available memory a configuration may plan to use: 1.3b x 4 with the fast
# mean (about 21 GB planned) reached 19.8 GB resident of 22 GB available, the rest of the
# machine's work squeezed into 2 GB, before it was stopped.
MEMORY_SHARE = 0.8
STATE_SLACK = 0.1  # the resident goal: at most this share of the state before, and one reply
JUDGED_FROM_PARAMS = 1e8  # bodies the target is judged on (when the run has any)
FLOAT32 = 4
WEIGHT = 1000  # tokens per reply
POISON = 1e3  # mean-clipped: the last reply's factor
MODES = {"mean": "mean", "mean-clipped": "mean", "median": "median", "trimmed-mean": "trimmed-mean"}
# The authors' MPT shapes in Llama form: (hidden, layers, SwiGLU width ~ 8/3 hidden)
PAPER_BODIES = {"125m": (768, 12, 2048), "350m": (1024, 24, 2816), "1.3b": (2048, 24, 5632)}


def llama_body(hidden: int, layers: int, mlp: int) -> dict[str, tuple[int, ...]]:
    """The body tensors of a Llama decoder: per layer 4 h² of attention, 3 h·mlp of SwiGLU
    and two norms, and the final norm (16 heads or 12 change no shape)."""
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


def body_shapes(params: float) -> dict[str, tuple[int, ...]]:
    """Llama-like body of about ``params`` parameters: ~12 h² per layer (MLP width 8h/3)."""
    layers = 12 if params >= 1e7 else 4
    hidden = max(64, round(math.sqrt(params / (12 * layers)) / 64) * 64)
    return llama_body(hidden, layers, round(hidden * 8 / 3 / 64) * 64)


def shapes_of(body: str) -> dict[str, tuple[int, ...]]:
    """A body named in :data:`PAPER_BODIES`, or a number of parameters (``3e5``)."""
    return llama_body(*PAPER_BODIES[body]) if body in PAPER_BODIES else body_shapes(float(body))


def make_instruction(node: int) -> Message:
    """A train instruction for ``node``, as the strategy sends it (no arrays needed here)."""
    instruction = Message(RecordDict({keys.CONFIG: ConfigRecord()}), node, "train")
    instruction.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # the SuperLink's job
    return instruction


def make_reply(instruction: Message, delta: Iterable[tuple[str, np.ndarray]]) -> Message:
    """A training reply as a ClientApp sends it, to ``instruction``."""
    node = instruction.metadata.dst_node_id
    content = RecordDict(
        {
            keys.ARRAYS: ArrayRecord({k: Array(v) for k, v in delta}),
            keys.METRICS: MetricRecord(
                {keys.NUM_EXAMPLES: WEIGHT, keys.TRAIN_LOSS: 2.0, keys.LOCAL_STEPS: 25}
            ),
            keys.INFO: ConfigRecord({keys.SOURCE: f"source-{node}"}),
        }
    )
    return Message(content, reply_to=instruction)


def pseudo_gradient(
    shapes: dict[str, tuple[int, ...]], pool: np.ndarray, factor: float
) -> Iterator[tuple[str, np.ndarray]]:
    """One reply's Δ, a tensor at a time: the random ``pool`` reshaped and scaled, so no
    reply needs a body of its own before it is serialised."""
    for name, shape in shapes.items():
        yield name, pool[: math.prod(shape)].reshape(shape) * np.float32(factor)


def replies_for(
    instructions: list[Message], shapes: dict[str, tuple[int, ...]], mode: str
) -> Iterator[Message]:
    """The replies, each made when it is asked for; honest ones differ by up to 2x in
    size, and under ``mean-clipped`` the last one is :data:`POISON` times too large."""
    pool = np.random.default_rng(0).standard_normal(
        max(math.prod(s) for s in shapes.values()), np.float32
    ) * np.float32(1e-3)
    for k, instruction in enumerate(instructions):
        factor = 1 + k / len(instructions)
        if mode == "mean-clipped" and k == len(instructions) - 1:
            factor *= POISON
        yield make_reply(instruction, pseudo_gradient(shapes, pool, factor))


def aggregate(
    strategy: DeptStrategy, instructions: list[Message], replies: Iterable[Message]
) -> None:
    """One round's aggregation and outer step, through ``DeptStrategy.aggregate_train``, for
    the replies to ``instructions`` (the strategy credits only replies to what it sent)."""
    for message in instructions:
        node = message.metadata.dst_node_id
        strategy.in_flight.track(message, Target(node, f"source-{node}"))
    arrays, _ = strategy.aggregate_train(1, replies)
    if arrays is None:
        raise RuntimeError("the benchmark's round changed nothing")


def server_state(shapes: dict[str, tuple[int, ...]], outer_kind: str) -> OuterOptimizer:
    """The body and the outer optimizer's state (Nesterov's momentum made by a first step
    of zero-stride zeros, so it exists before the round as it would from round 2 on)."""
    import torch

    outer = OuterOptimizer({n: torch.zeros(s) for n, s in shapes.items()}, kind=outer_kind)
    if outer_kind != "fedavg":
        outer.step({n: torch.zeros(1).expand(s) for n, s in shapes.items()})
    return outer


def measure(
    body: str, replies: int, path: str, mode: str, outer_kind: str, spool: Path, memory: str
) -> dict[str, Any]:
    """One configuration, in a fresh process: seconds and peak memory of the aggregation."""
    import torch

    torch.set_num_threads(1)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    # A first tiny round loads what the code path imports lazily, before the baseline.
    first = make_instruction(1)
    warm = DeptStrategy(server_state({"w": (16,)}, "fedavg"), StrategySettings("b", 25))
    aggregate(warm, [first], replies_for([first], {"w": (16,)}, "mean"))
    shapes = shapes_of(body)
    body_bytes = sum(math.prod(s) for s in shapes.values()) * FLOAT32
    defences = Defences(aggregation=MODES[mode])
    settings = StrategySettings(
        "bench", 25, spool_dir=spool, defences=defences, server_memory=memory
    )
    strategy = DeptStrategy(server_state(shapes, outer_kind), settings)
    instructions = [make_instruction(i + 1) for i in range(replies)]
    made = replies_for(instructions, shapes, mode)
    held: list[Message] = list(made) if path == "strategy" else []  # as Flower hands them
    message_bytes = sum(r.content.array_records[keys.ARRAYS].count_bytes() for r in held)
    gc.collect()
    reset_peak()
    before = rss_bytes()  # what the server held before the round's replies came in
    tracemalloc.start()
    started = time.perf_counter()
    aggregate(strategy, instructions, held or made)
    seconds = time.perf_counter() - started
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    peak = peak_rss_bytes() - before
    return {
        "body": body,
        "path": path,
        "mode": mode,
        "memory": memory,
        "outer": outer_kind,
        "body_params": body_bytes // FLOAT32,
        "replies": replies,
        "state_before_gb": before / 1e9,
        "seconds": seconds,
        "seconds_per_reply": seconds / replies,
        "peak_bytes": peak,
        "peak_x_body": peak / body_bytes,
        "held_x_body": message_bytes / body_bytes,
        "traced_x_body": traced / body_bytes,
        "traced_met": traced / body_bytes <= TARGETS[memory] + TEMPORARIES,
        "resident_met": peak <= STATE_SLACK * before + body_bytes,
        "clipped": len(strategy.history.rounds[1].clipped),
    }


def plans(args: argparse.Namespace) -> list[tuple[str, int, str, str, str]]:
    """(body, replies, path, mode, server memory) of every configuration asked for."""
    pairs = [(body, replies) for body, replies in args.bodies]
    pairs += [(f"{size:g}", replies) for size in args.sizes for replies in args.replies]
    out = []
    for body, replies in pairs:
        body_gb = sum(math.prod(s) for s in shapes_of(body).values()) * FLOAT32 / 1e9
        for mode in args.modes:
            for memory in args.server_memory:
                # θ and the outer state (state_copies counts the gradient, which is the
                # round's mean: θ stands in for it), the round's bodies, the interpreter
                bodies = OUTER_OPTIMIZERS[args.outer].state_copies + TARGETS[memory] + TEMPORARIES
                need_gb = body_gb * bodies + BASELINE_GB
                if need_gb > MEMORY_SHARE * available_gb():  # not swapped or killed here
                    print(
                        f"{body} x {replies} {mode} {memory}: skipped, needs ~{need_gb:.0f} GB "
                        f"of the {available_gb():.0f} GB available",
                        flush=True,
                    )
                    continue
                out.append((body, replies, "streamed", mode, memory))
                if replies * body_gb <= args.hold_limit_gb:
                    out.append((body, replies, "strategy", mode, memory))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for body, replies, path, mode, memory in plans(args):  # a fresh process each, one at a time
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            job = pool.submit(measure, body, replies, path, mode, args.outer, args.spool, memory)
            row = job.result()
        print(
            f"{body} ({row['body_params'] / 1e6:.1f}M) x {replies} {path} {mode} {memory}: "
            f"{row['seconds']:.2f} s, peak {row['peak_x_body']:.2f}x body",
            flush=True,
        )
        rows.append(row)
    result = summarise(args, rows)
    write_outputs(args.out, "server_scaling", result, rows)
    return 0


def summarise(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    table = print_table(
        "server aggregation: time and peak memory above the body and the outer optimizer's "
        f"state, in float32 bodies (target, traced, bodies >= {JUDGED_FROM_PARAMS:.0e} params: "
        f"fast <= {TARGETS['fast']:g}x, one sum and the reply read, lean <= "
        f"{TARGETS['lean']:g}x, + {TEMPORARIES:g} of temporaries; resident: <= "
        f"{STATE_SLACK:g} x state + one body)",
        [
            "body",
            "params",
            "replies",
            "path",
            "mode",
            "memory",
            "outer",
            "state GB",
            "s/reply",
            "peak MB",
            "held x body",
            "peak x body",
            "traced x body",
            "met (traced, resident)",
        ],
        [
            (
                r["body"],
                f"{r['body_params'] / 1e6:.1f}M",
                r["replies"],
                r["path"],
                r["mode"],
                r["memory"],
                r["outer"],
                r["state_before_gb"],
                r["seconds_per_reply"],
                r["peak_bytes"] / 1e6,
                r["held_x_body"],
                r["peak_x_body"],
                r["traced_x_body"],
                f"{_yes(r['traced_met'])}, {_yes(r['resident_met'])}",
            )
            for r in rows
        ],
    )
    # Judged on what the code allocates (traced), with a tenth of a body for the per-tensor
    # temporaries (float64 chunks, a tensor being serialised): a constant few tens of MB, so
    # only bodies of 100M parameters and more are judged. The RSS peak is reported beside it:
    # it also holds the allocator's retained pages and torch's own temporaries.
    judged = [r for r in rows if r["body_params"] >= JUDGED_FROM_PARAMS] or rows
    return {
        **result_header("server_scaling", args, 1),
        "table": table,
        "targets_x_body": TARGETS,
        "judged_from_params": JUDGED_FROM_PARAMS,
        "worst_traced_x_body": max(r["traced_x_body"] for r in judged),
        "worst_peak_x_body": max(r["peak_x_body"] for r in judged),
        "met": all(r["traced_met"] for r in judged),
        "resident_met": {
            f"{r['body']} x {r['replies']} {r['path']} {r['mode']} {r['memory']}": r["resident_met"]
            for r in judged
        },
    }


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=_list(float), default=[1e6, 1e7, 1e8], help="body params, swept"
    )
    parser.add_argument("--replies", type=_list(int), default=[2, 8, 64], help="swept")
    parser.add_argument(
        "--bodies",
        type=_list(_body_replies),
        default=[],
        help="named bodies with their replies, e.g. 350m:16,1.3b:4 (besides the sweep)",
    )
    parser.add_argument("--paper", action="store_true", help="350m:16,1.3b:4 only")
    parser.add_argument("--modes", type=_list(str), default=["mean"], help=", ".join(MODES))
    parser.add_argument("--outer", default="fedavg", help="outer optimizer (its state is kept)")
    parser.add_argument(
        "--server-memory",
        type=_list(str),
        default=["fast"],
        help="fast (the running mean), lean (the mean from the spool at the end), or both",
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
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown mode(s) {sorted(unknown)}; choose from {', '.join(MODES)}")
    if unknown := set(args.server_memory) - set(TARGETS):
        parser.error(f"unknown --server-memory {sorted(unknown)}; choose from fast, lean")
    if args.quick:
        args.sizes, args.replies = [1e6, 4e6], [2, 4]
    if args.paper:
        args.sizes, args.bodies = [], [("350m", 16), ("1.3b", 4)]
    return args


def _list(kind: Any) -> Any:
    return lambda text: [kind(x) for x in text.split(",")]


def _body_replies(text: str) -> tuple[str, int]:
    body, _, replies = text.partition(":")
    if body not in PAPER_BODIES or not replies.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected <{'|'.join(PAPER_BODIES)}>:<n>")
    return body, int(replies)


if __name__ == "__main__":
    raise SystemExit(main())
