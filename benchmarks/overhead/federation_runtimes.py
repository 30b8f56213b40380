"""The same federation under Ray and as processes, against STD on the same tokens.

    python -m benchmarks.overhead.federation_runtimes             # debug and tiny
    python -m benchmarks.overhead.federation_runtimes --models debug --repeats 1

For each model, in turn (rotating who goes first each repeat):

- ``ray``: ``dept run --federation ray``, Flower's simulation;
- ``processes``: ``dept run --federation processes``, a SuperLink and a SuperNode process per
  source on loopback;
- ``std``: STD (τ = 0.3) in one process, a torch thread per core, the same model and tokens
  per round.

Each federated run trains the built-in sources, every round, and evaluates only before the
first round and after the last (``fraction-evaluate=0``), so a middle round's wall time is
training and orchestration. It reports the time from the command to the first round line
(round 0, the evaluation before training) and to the first trained round, the median wall
time of the rounds after the first, and the peak memory of all the run's processes together
(proportional set size, sampled every 0.5 s).
STD's round is its wall time for the same tokens, with its evaluation of 8 KB per source
after each round (a fraction of a second at these sizes). Results:
``federation_runtimes.{json,csv,txt,png}`` in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from benchmarks.measure import (
    interleave,
    median_of,
    plot_lines,
    print_table,
    result_header,
    write_outputs,
)
from server_app.local_runtime import processes_with

ROUND_LINE = re.compile(r"round (\d+)/\d+ done.*?; (\d+) s elapsed")
SAMPLE_S = 0.5


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead.federation_runtimes", description=__doc__
    )
    parser.add_argument("--models", default="debug,tiny")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=1200.0, help="per run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/federation-runtimes"))
    parser.add_argument("--work", type=Path, default=Path("outputs/bench/federation-runtimes"))
    return parser.parse_args(argv)


def settings(model: str, rounds: int) -> str:
    return f"model='{model}' num-server-rounds={rounds} fraction-evaluate=0.0 eval-bytes=8192"


class PeakMemory:
    """The largest summed PSS of ``find()``'s processes (a page shared by n processes counts
    1/n in each: forked children and torch's libraries are not counted n times), sampled
    in a thread."""

    def __init__(self, find: Callable[[], list[psutil.Process]]) -> None:
        self.find, self.peak, self._done = find, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(SAMPLE_S):
            total = 0
            for process in self.find():
                try:
                    total += process.memory_full_info().pss
                except psutil.Error:
                    continue
            self.peak = max(self.peak, total)


def federated(kind: str, model: str, args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    """``dept run --federation KIND``: first round lines, middle rounds, peak memory."""
    work = (args.work / f"{kind}-{model}-{repeat}").resolve()
    shutil.rmtree(work, ignore_errors=True)
    out = work / "run"
    config = f"{settings(model, args.rounds)} output-dir='{out}' state-dir='{work / 'state'}'"
    command = [sys.executable, "-m", "dept_cli", "run", "--federation", kind, "--no-stream"]
    started = time.monotonic()
    launcher = subprocess.Popen([*command, "-c", config], stdout=subprocess.PIPE, text=True)

    def run_processes() -> list[psutil.Process]:
        found = {p.pid: p for p in processes_with("FLWR_HOME", str(out / ".flwr"))}
        with contextlib.suppress(psutil.Error):
            found.update({c.pid: c for c in psutil.Process(launcher.pid).children(True)})
        return list(found.values())

    with PeakMemory(run_processes) as memory:
        printed, _ = launcher.communicate(timeout=args.timeout_s)
    wall = time.monotonic() - started
    if launcher.returncode != 0:
        raise RuntimeError(f"dept run --federation {kind} failed:\n{printed[-2000:]}")
    lines = (out / "run.log").read_text()
    elapsed = {int(r): float(s) for r, s in ROUND_LINE.findall(lines)}
    rounds = round_walls(out / "metrics.jsonl")
    return {
        "model": model,
        "runtime": kind,
        "first_round_line_s": elapsed.get(0),
        "first_trained_round_s": elapsed.get(1),
        "round_s": statistics.median(rounds[1:]) if len(rounds) > 1 else rounds[0],
        "rounds_s": rounds,
        "tokens_per_round": tokens_per_round(out / "metrics.jsonl"),
        "peak_pss_mb": memory.peak / 2**20,
        "wall_s": wall,
    }


def round_walls(metrics: Path) -> list[float]:
    """Each trained round's wall time (the last one's evaluation included)."""
    walls = [json.loads(line)["wall_s"] for line in metrics.read_text().splitlines()]
    return [after - before for before, after in itertools.pairwise(walls)]


def tokens_per_round(metrics: Path) -> int:
    first = json.loads(metrics.read_text().splitlines()[1])
    return sum(int(s["tokens"] or 0) for s in first["sources"].values())


def standard(model: str, args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    """STD τ = 0.3 on the same sources, model and tokens per round, in one process."""
    import torch

    from dept.config import load_config
    from dept.data.sources import run_sources
    from dept.train.baselines import run_standard
    from server_app.config_pairs import parse_pairs
    from server_app.launch import app_defaults, project_dir

    torch.set_num_threads(len(os.sched_getaffinity(0)))  # the arms run in turn: all cores
    work = (args.work / f"std-{model}-{repeat}").resolve()
    shutil.rmtree(work, ignore_errors=True)
    overrides = parse_pairs([settings(model, args.rounds)], "-c")
    cfg = load_config(app_defaults(project_dir()), overrides=overrides)
    specs = run_sources(cfg)
    ends: list[float] = []
    run = run_standard(
        cfg,
        specs,
        work / "state",
        temperature=0.3,
        sources_per_round=len(specs),
        on_round=lambda _: ends.append(time.perf_counter()),
    )
    walls = [b - a for a, b in itertools.pairwise(ends)]
    return {
        "model": model,
        "runtime": "std",
        "round_s": statistics.median(walls),
        "rounds_s": walls,
        "tokens_per_round": run.tokens_trained // cfg.num_server_rounds,
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.pop("FLWR_HOME", None)
    models = args.models.split(",")
    arms: dict[str, Callable[[int], dict[str, Any]]] = {}
    for model in models:
        arms[f"ray {model}"] = functools.partial(federated, "ray", model, args)
        arms[f"processes {model}"] = functools.partial(federated, "processes", model, args)
        arms[f"std {model}"] = functools.partial(standard, model, args)
    rows = interleave(arms, args.repeats)
    table_rows = []
    for model in models:
        std = median_of(rows, f"std {model}", "round_s")
        for kind in ("ray", "processes"):
            arm = f"{kind} {model}"
            table_rows.append(
                (
                    model,
                    kind,
                    median_of(rows, arm, "first_round_line_s"),
                    median_of(rows, arm, "first_trained_round_s"),
                    median_of(rows, arm, "round_s"),
                    std,
                    median_of(rows, arm, "round_s") / std,
                    median_of(rows, arm, "peak_pss_mb"),
                )
            )
    table = print_table(
        f"federation runtimes on {os.cpu_count()} cores: the built-in 4 sources, "
        f"{args.rounds} rounds, medians of {args.repeats}",
        [
            "model",
            "runtime",
            "round 0 line s",
            "round 1 line s",
            "round s",
            "STD round s",
            "round / STD",
            "peak PSS MB",
        ],
        table_rows,
    )
    result = {**result_header("federation_runtimes", args, None), "table": table}
    write_outputs(args.out, "federation_runtimes", result, rows)
    plot_lines(
        args.out / "federation_runtimes.png",
        [
            (arm, list(range(1, len(r["rounds_s"]) + 1)), r["rounds_s"])
            for arm in arms
            for r in rows
            if r["arm"] == arm and r["repeat"] == 0
        ],
        xlabel="round",
        ylabel="wall s",
        yscale="log",
        title="a round's wall time",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
