"""The quickstart as a new user meets it: ``dept run`` with nothing but its defaults, on a
fresh state folder (tokenizers and text caches built from nothing), alone and beside busy
processes (``python -c "while True: pass"``, one core each), the settings taking turns.

The README promises minutes on a CPU. What breaks that is the machine's other work: torch
threads that outnumber the free cores wait on each other, so the table gives each round's
wall time and training tokens/s, not only the total. ::

    python -m benchmarks.overhead.quickstart --busy 0,1   # alone, then beside one busy process

Results: ``quickstart.json``, ``quickstart.csv``, ``quickstart.txt`` and ``quickstart.png``
in ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.measure import (
    interleave,
    plot_lines,
    print_table,
    result_header,
    write_outputs,
)

BUSY = [sys.executable, "-c", "while True: pass"]
LAUNCH_LINE = re.compile(r"^(\d\d:\d\d:\d\d )?dept run: ")  # the stamp, if any, and the name
# The server's line for round 0 (the models evaluated before training): the first a user
# sees of the federation working, its elapsed time counted from the command.
ROUND_0 = re.compile(r"round 0/\d+ done: .*; (\d+) s elapsed")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead.quickstart", description=__doc__
    )
    parser.add_argument("--busy", default="0,1", help="busy processes beside the run, in turn")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    parser.add_argument(
        "-c", "--run-config", action="append", default=[], help="passed on to dept run"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/quickstart"))
    parser.add_argument("--work", type=Path, default=Path("outputs/bench/quickstart"))
    return parser.parse_args(argv)


def rounds(metrics: Path) -> list[dict[str, Any]]:
    """Each training round of a run: its wall time and its sources' median tokens/s."""
    rows, before = [], 0.0
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        speeds = [s["tokens_per_s"] for s in record["sources"].values() if s["tokens_per_s"]]
        if record["round"] > 0:
            median = statistics.median(speeds) if speeds else None
            rows.append(
                {
                    "round": record["round"],
                    "wall_s": record["wall_s"] - before,
                    "tokens_per_s": median,
                }
            )
        before = record["wall_s"]
    return rows


def first_round_line_s(run_log: Path) -> int:
    """Seconds from the command to the round 0 line, as that line says."""
    found = ROUND_0.search(run_log.read_text(errors="replace"))
    if found is None:
        raise RuntimeError(f"{run_log} has no round 0 line")
    return int(found.group(1))


def one_run(busy: int, args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    """``dept run`` on a fresh state folder beside ``busy`` spinning processes."""
    work = (args.work / f"busy-{busy}-{repeat}").resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache")}  # a fresh ~/.cache/dept
    command = ["dept", "run", "--no-stream", "-c", f"output-dir='{work / 'run'}'"]
    for extra in args.run_config:
        command += ["-c", extra]
    spinners = [subprocess.Popen(BUSY, start_new_session=True) for _ in range(busy)]
    try:
        started = time.monotonic()
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=args.timeout_s
        )
        wall = time.monotonic() - started
    finally:
        for spinner in spinners:
            os.killpg(spinner.pid, signal.SIGKILL)
            spinner.wait()
    if done.returncode != 0:
        raise RuntimeError(f"dept run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    per_round = rounds(work / "run" / "metrics.jsonl")
    launch = next((line for line in done.stdout.splitlines() if "SuperNodes" in line), "")
    return {
        "busy": busy,
        "wall_s": round(wall, 1),
        "round0_line_s": first_round_line_s(work / "run" / "run.log"),
        "launch": launch,
        "rounds": per_round,
        **{f"round{r['round']}_s": round(r["wall_s"], 1) for r in per_round},
        **{f"round{r['round']}_tokens_per_s": r["tokens_per_s"] for r in per_round},
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    lines = [
        (
            f"{row['busy']} busy, {row['wall_s']:.0f} s in all",
            [r["round"] for r in row["rounds"]],
            [r["tokens_per_s"] for r in row["rounds"]],
        )
        for row in rows
    ]
    plot_lines(
        path,
        lines,
        xlabel="round",
        ylabel="training tokens/s (median source)",
        yscale="log",
        title="dept run's quickstart, fresh state",
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(b) for b in args.busy.split(",")]
    arms: dict[str, Callable[[int], dict[str, Any]]] = {
        f"busy-{b}": functools.partial(one_run, b, args) for b in counts
    }
    rows = interleave(arms, args.repeats)
    table = print_table(
        f"dept run quickstart on {os.cpu_count()} cores, fresh state",
        [
            "busy",
            "wall s",
            "round 0 line s",
            "round 1 s",
            "round 1 tok/s",
            "last round tok/s",
            "launch line",
        ],
        [
            (
                r["busy"],
                r["wall_s"],
                r["round0_line_s"],
                r["rounds"][0]["wall_s"],
                r["rounds"][0]["tokens_per_s"],
                r["rounds"][-1]["tokens_per_s"],
                LAUNCH_LINE.sub("", r["launch"].split("; ")[0]),
            )
            for r in rows
        ],
    )
    result = {**result_header("quickstart", args, None), "table": table}
    write_outputs(args.out, "quickstart", result, rows)
    plot(rows, args.out / "quickstart.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
