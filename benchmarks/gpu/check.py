"""One prepared GPU check: what a CUDA machine gives this project, in under 8 minutes.

    python -m benchmarks.gpu.check                 # the whole check, on a CUDA machine
    python -m benchmarks.gpu.check --quick         # its short form (tiny models, a few steps)

Prints the device, torch and CUDA versions; measures training tokens/s and MFU of ``125m``
and ``350m`` (bf16, fused AdamW, flash SDPA), eager and under ``torch.compile``
(:mod:`benchmarks.gpu.training`); runs ``dept run --federation processes`` on the four
built-in sources sharing the GPU (a SuperNode process each, no Ray, Flower's commands run
by this interpreter: a machine image without Ray or Flower's entry points runs it) for two
short rounds, and reports each round's wall time and its
orchestration share (round wall time minus the slowest client's training time, over the
round's wall time: the clients train at once); runs a source on two processes (``nproc =
2``, one GPU each) where two GPUs are visible. Writes one JSON (``--out``) and prints a table.

Every measurement runs in a process of its own with its own time cap, so one that fails,
hangs or runs out of memory is recorded (status and its one-line error) and the others run.
The budget (``--budget-s``, 450 s) bounds the whole: a step's cap is cut to what the budget
has left (less the time ``dept run`` takes to stop its runtime), and a step with too little
left is skipped, saying so. The steps run cheapest and most telling first (eager training,
the federation, the two-process source), the compiled training (mostly compile time) last.

Without CUDA it says so on its first line and in the JSON (``"gpu_used": false``), and runs
the smallest version of each step on the CPU (``debug`` model, a few steps, ``torch.compile``
with the ``eager`` backend, the two-process source on gloo), so CI proves the check works.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flwr
import torch
import transformers

from benchmarks.measure import PROJECT, print_table, result_header
from dept.state.strict_json import dumps

STOP_GRACE_S = 35.0  # dept run stops every process of its run within 30 s of SIGTERM
MIN_CAP_S = 15.0  # a step with less time than this left is skipped
NO_GPU = (
    "NO GPU USED: no CUDA device is visible, so this runs the smallest version of each step "
    "on the CPU; its numbers say nothing about a GPU"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TRAINS_ON = re.compile(r"(\S+): trains on (.+)$")
PLACEMENT = re.compile(r"^\s+node \d+ \((.*)\): (.+)$")  # dept run's line per node
RANKS = re.compile(r"\[rank 0/(\d+)\]")  # what rank 0 of a multi-process source logs
MULTI_SOURCE = "- {name: synth-latin, path: 'builtin:synthetic-latin', nproc: 2}\n"


@dataclass(frozen=True)
class Plan:
    """How big each step is: the paper sizes on a GPU, tiny ones for ``--quick`` and CPUs."""

    models: tuple[str, ...]
    training: tuple[str, ...]  # gpu_training's arguments besides model, compile, out
    compile_backend: str
    eager_cap_s: float
    compiled_cap_s: float
    federation: str  # dept run's run config for both dept run steps
    federation_cap_s: float


GPU_FULL = Plan(
    models=("125m", "350m"),
    training=("--batch-size", "32", "--seq-len", "1024", "--steps", "20", "--warmup", "5"),
    compile_backend="inductor",
    eager_cap_s=60,
    compiled_cap_s=120,
    federation="model='125m' seq-len=1024 batch-size=8 local-steps=20 warmup-steps=2",
    federation_cap_s=180,
)
GPU_QUICK = dataclasses.replace(
    GPU_FULL,
    models=("tiny",),
    training=("--batch-size", "8", "--seq-len", "256", "--steps", "3", "--warmup", "2"),
    federation="model='tiny' seq-len=128 batch-size=4 local-steps=4 warmup-steps=1",
)
CPU = Plan(
    models=("debug",),
    training=(
        *("--device", "cpu", "--threads", "1", "--batch-size", "2", "--seq-len", "32"),
        *("--steps", "2", "--warmup", "1"),
    ),
    compile_backend="eager",
    eager_cap_s=60,
    compiled_cap_s=90,
    federation=("model='debug' seq-len=64 batch-size=4 local-steps=4 warmup-steps=1 device='cpu'"),
    federation_cap_s=240,
)
# Every dept run step: rounds only train (evaluation is not orchestration), few eval bytes.
FEDERATION_COMMON = "fraction-evaluate=0.0 eval-bytes=4096"


@dataclass(frozen=True)
class Step:
    """One measurement: a command run in its own process, and what its outputs say."""

    name: str
    cap_s: float
    grace_s: float  # how long it may take to stop after SIGTERM
    command: list[str] | None  # None: skipped, ``skipped`` says why
    read: Callable[[Path], dict[str, Any]]  # its figures, from its outputs and its log
    skipped: str = ""


class Budget:
    """The seconds the whole check has left."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, time.monotonic()

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)


def environment() -> dict[str, Any]:
    """The device and the versions that decide its speed."""
    gpus = [
        {
            "name": torch.cuda.get_device_name(i),
            "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
        }
        for i in range(torch.cuda.device_count())
    ]
    return {
        "gpus": gpus,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if gpus else None,
        "transformers": transformers.__version__,
        "flwr": flwr.__version__,
        "python": platform.python_version(),
    }


def training_step(plan: Plan, model: str, compile_model: bool, work: Path) -> Step:
    """tokens/s and MFU of ``model`` by :mod:`benchmarks.gpu.training`."""
    name = f"training {model} {'compiled' if compile_model else 'eager'}"
    out = work / name.replace(" ", "-")
    command = [sys.executable, "-m", "benchmarks.gpu.training", "--model", model, *plan.training]
    if compile_model:
        command += ["--compile", "--compile-backend", plan.compile_backend]
    return Step(
        name,
        plan.compiled_cap_s if compile_model else plan.eager_cap_s,
        5.0,
        [*command, "--out", str(out)],
        lambda _: read_training(out / "gpu_training.json"),
    )


def read_training(path: Path) -> dict[str, Any]:
    result = json.loads(path.read_text())
    keys = ("params", "tokens_per_s", "achieved_tflops", "peak_tflops", "mfu", "attention")
    return {
        **{k: result[k] for k in keys},
        "first_steps_s": result["warmup_s"],  # compilation included
        "max_memory_gib": (result["max_memory_allocated"] or 0) / 2**30 or None,
    }


def dept_run_step(name: str, plan: Plan, work: Path, rounds: int, sources: str = "") -> Step:
    """``dept run`` as a user starts it, on its own runtime, writing under ``work/name``."""
    out = work / name.replace(" ", "-")
    settings = f"{plan.federation} {FEDERATION_COMMON} num-server-rounds={rounds}"
    paths = f"output-dir='{out / 'run'}' state-dir='{out / 'state'}'"
    if sources:
        out.mkdir(parents=True, exist_ok=True)
        (out / "sources.yaml").write_text(sources)
        paths += f" sources-file='{out / 'sources.yaml'}'"
    command = [sys.executable, "-m", "dept_cli", "run", "--federation", "processes"]
    command += ["--no-stream", "-c", f"{settings} {paths}"]
    return Step(
        name, plan.federation_cap_s, STOP_GRACE_S, command, lambda log: read_run(out / "run", log)
    )


def read_run(out: Path, log: Path) -> dict[str, Any]:
    """Per round: wall time, the clients' training times, the orchestration share; what
    dept run gave each node (``log``: its output) and the devices the clients said they
    train on (the run's log, and the nodes' logs of a federation of processes)."""
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    walls = {line["round"]: line["wall_s"] for line in lines}
    rounds = []
    for line in lines:
        if line["round"] == 0:
            continue
        trained = [s["train_s"] for s in line["sources"].values() if s["train_s"] is not None]
        wall = line["wall_s"] - walls[line["round"] - 1]
        slowest = max(trained, default=0.0)
        rounds.append(
            {
                "round": line["round"],
                "clients": len(trained),
                # the last round evaluates every source (fraction-evaluate spares the others)
                "evaluated": sum(s["val_bpb"] is not None for s in line["sources"].values()),
                "round_s": wall,
                "slowest_training_s": slowest,
                "sum_training_s": sum(trained),
                "orchestration_share": (wall - slowest) / wall if wall > 0 else None,
            }
        )
    # the clients' lines: in the run's log under Ray, in each node's log as processes
    logs = [out / "run.log", *sorted((out / ".flwr" / "processes" / "logs").glob("node-*.log"))]
    run_log = ANSI.sub("", "".join(path.read_text(errors="replace") for path in logs))
    devices = sorted({m.group(2) for m in map(TRAINS_ON.search, run_log.splitlines()) if m})
    placed = (PLACEMENT.search(line) for line in ANSI.sub("", log.read_text()).splitlines())
    return {
        "rounds": rounds,
        "node_placements": {m.group(1): m.group(2) for m in placed if m},
        "client_devices": devices,
        "processes": max((int(n) for n in RANKS.findall(run_log)), default=1),
    }


def steps(plan: Plan, work: Path, gpu: bool) -> list[Step]:
    """The check's steps, in the order they run (see the module's docstring)."""
    eager = [training_step(plan, m, False, work) for m in plan.models]
    compiled = [training_step(plan, m, True, work) for m in plan.models]
    federation = dept_run_step("federation 4 sources", plan, work, rounds=2)
    gpus = torch.cuda.device_count()
    if not gpu or gpus >= 2:
        multi = dept_run_step("source on 2 processes", plan, work, 1, MULTI_SOURCE)
    else:
        multi = Step("source on 2 processes", 0, 0, None, lambda _: {}, f"skipped: {gpus} GPU")
    return [*eager, federation, multi, *compiled]


def run_step(step: Step, budget: Budget, logs: Path) -> dict[str, Any]:
    """Run ``step`` within its cap and what the budget leaves; its row, failed or not."""
    cap = min(step.cap_s, budget.left() - step.grace_s)
    row: dict[str, Any] = {"step": step.name, "cap_s": round(max(cap, 0.0), 1)}
    if step.command is None or cap < MIN_CAP_S:
        why = step.skipped or f"skipped: {budget.left():.0f} s of the budget left"
        return {**row, "status": why, "seconds": 0.0, "error": None}
    log = logs / f"{step.name.replace(' ', '-')}.log"
    print(f"gpu check: {step.name} (at most {cap:.0f} s) ...", flush=True)
    started = time.monotonic()
    code = _run(step.command, cap, step.grace_s, log)
    row["seconds"] = round(time.monotonic() - started, 1)
    if code is None:
        return {**row, "status": "timed out", "error": f"no result within {cap:.0f} s ({log})"}
    if code != 0:
        return {**row, "status": "failed", "error": last_line(log)}
    try:
        return {**row, "status": "ok", "error": None, **step.read(log)}
    except (OSError, ValueError, KeyError) as exc:
        return {**row, "status": "failed", "error": f"its outputs: {type(exc).__name__}: {exc}"}


def _run(command: list[str], cap_s: float, grace_s: float, log: Path) -> int | None:
    """Exit code of ``command`` (output to ``log``); None if it ran past ``cap_s`` and was
    stopped (SIGTERM, then SIGKILL after ``grace_s``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT), env.get("PYTHONPATH")]))
    with log.open("w") as output:
        process = subprocess.Popen(
            command, cwd=PROJECT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            return process.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return None


def last_line(log: Path) -> str:
    """The error a failed command ended with: its last non-empty line of output."""
    lines = [ANSI.sub("", line).strip() for line in log.read_text(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), f"no output ({log})")


def table_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """One line per step; a federation's by its last round that only trained (the last
    round also evaluates every source), else its last round."""
    lines = []
    for row in rows:
        rounds = row.get("rounds") or [{}]
        last = next((r for r in reversed(rounds) if r.get("evaluated") == 0), rounds[-1])
        share = last.get("orchestration_share")
        lines.append(
            (
                row["step"],
                row["status"] if row["status"] != "failed" else f"failed: {row['error']}",
                row["seconds"],
                row.get("tokens_per_s", math.nan),
                f"{row['mfu']:.1%}" if row.get("mfu") is not None else "—",
                last.get("round_s", math.nan),
                f"{share:.1%}" if share is not None else "—",
            )
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = torch.cuda.is_available()
    if not gpu:
        print(NO_GPU, flush=True)
    plan = (GPU_QUICK if args.quick else GPU_FULL) if gpu else CPU
    budget = Budget(args.budget_s)
    work = args.out.parent / "work"
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = environment()
    gpus = ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in env["gpus"]) or "none"
    print(f"gpu check: GPUs {gpus}; torch {env['torch']}, CUDA {env['cuda']}", flush=True)
    rows = [run_step(step, budget, logs) for step in steps(plan, work, gpu)]
    title = (
        f"{'' if gpu else 'NO GPU USED - '}gpu check on {gpus}: torch {env['torch']}, "
        f"CUDA {env['cuda']}, {args.budget_s - budget.left():.0f} s of {args.budget_s:.0f}"
    )
    columns = ["step", "status", "seconds", "tokens/s", "MFU", "last round s", "orchestration"]
    table = print_table(title, columns, table_rows(rows))
    result = {
        **result_header("gpu_check", args, None),
        "gpu_used": gpu,
        "plan": "gpu-quick" if gpu and args.quick else "gpu" if gpu else "cpu",
        "environment": env,
        "total_s": round(args.budget_s - budget.left(), 1),
        "steps": rows,
        "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(result, indent=2))
    print(f"wrote {args.out}", flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, a few steps")
    parser.add_argument("--budget-s", type=float, default=450.0, help="the whole check's cap")
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu-check/gpu_check.json"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
