"""What every performance benchmark shares: the machine's state, interleaved repeats, output.

The machine these run on is shared and noisy, so a benchmark never compares two numbers
taken minutes apart: it runs its arms in turn, repeat after repeat (rotating who goes
first), and reports medians and ratios, with the load average it ran under.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dept.state.strict_json import dumps

PROJECT = Path(__file__).resolve().parents[1]  # the checkout: flwr run and dept run start here
CORPORA = PROJECT / "benchmarks" / "corpora.yaml"
RESULTS = PROJECT / "benchmarks" / "results"


def machine(threads: int | None = None) -> dict[str, Any]:
    """Where and under what load the numbers were taken (for the JSON)."""
    import torch

    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
        "torch_threads": threads if threads is not None else torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def common_arguments(parser: argparse.ArgumentParser, name: str, quick: str) -> None:
    """``--threads``, ``--quick``, ``--out`` (results, committed) and ``--work`` (state)."""
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a Ray actor's)")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{name}"))
    parser.add_argument("--work", type=Path, default=Path(f"outputs/bench/{name}"))


def parse_quick(
    parser: argparse.ArgumentParser, argv: list[str] | None, **quick: Any
) -> argparse.Namespace:
    """Parse ``argv``; with ``--quick``, ``quick``'s values are the defaults instead, so
    that an option given beside ``--quick`` still holds (``--quick --repeats 1``)."""
    if parser.parse_args(argv).quick:
        parser.set_defaults(**quick)
    return parser.parse_args(argv)


def result_header(name: str, args: argparse.Namespace, threads: int | None) -> dict[str, Any]:
    """What every result JSON starts with: which benchmark, its settings, the machine."""
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return {"benchmark": name, "settings": settings, "machine": machine(threads)}


def interleave(
    arms: dict[str, Callable[[int], dict[str, Any]]], repeats: int
) -> list[dict[str, Any]]:
    """Run every arm ``repeats`` times, in turn, rotating the order each repeat; one row per
    run with ``arm`` and ``repeat`` added. An arm gets the repeat index (0-based)."""
    names = list(arms)
    rows = []
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            rows.append({"arm": name, "repeat": repeat, **arms[name](repeat)})
    return rows


def median_of(rows: Sequence[dict[str, Any]], arm: str, key: str) -> float:
    values = [float(r[key]) for r in rows if r["arm"] == arm and r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print the table; its text, for the result files."""
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    console = Console(width=160, record=True)
    console.print(table)
    return console.export_text()


def _cell(value: Any) -> str:
    if isinstance(value, float) and value != value:  # NaN: not measured for this row
        return "—"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def write_outputs(out: Path, name: str, result: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """``<name>.json`` (everything), ``<name>.csv`` (the per-run rows) and ``<name>.txt``
    (the printed ``result["table"]``) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.txt").write_text(result["table"])
    (out / f"{name}.json").write_text(dumps({**result, "runs": rows}, indent=2))
    columns = sorted({k for r in rows for k in r if not isinstance(r[k], dict | list)})
    with (out / f"{name}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out / f'{name}.json'}, {name}.csv and {name}.txt", flush=True)


def plot_lines(
    path: Path, lines: Sequence[tuple[str, Sequence[float], Sequence[float]]], **axes: Any
) -> None:
    """A PNG of ``(label, xs, ys)`` lines with markers; ``axes`` set the axes (xlabel,
    ylabel, title, yscale...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, xs, ys in lines:
        ax.plot(xs, ys, marker="o", label=label)
    ax.set(**axes)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def corpora_run_config(names: Sequence[str], work: Path, **overrides: Any) -> dict[str, Any]:
    """A run config over the named sources of ``benchmarks/corpora.yaml`` (read in place),
    state and outputs under ``work``; ``overrides`` in kebab-case, e.g. ``local_steps``."""
    from dept.config import DeptConfig, kebab, load_config, to_run_config
    from dept.data.sources import load_sources, write_sources

    work = work.resolve()  # a flwr run reads these paths from the checkout, not from here
    known = {s.name: s for s in load_sources(CORPORA)}
    unknown = sorted(set(names) - known.keys())
    if unknown:
        raise SystemExit(f"unknown source(s) {unknown}; {CORPORA} lists {sorted(known)}")
    work.mkdir(parents=True, exist_ok=True)
    sources_file = work / "sources.yaml"
    write_sources(sources_file, [known[n] for n in names])
    layer = {
        "sources-file": str(sources_file),
        "state-dir": str(work / "state"),
        "output-dir": str(work / "run"),
        "device": "cpu",
        **{kebab(k): v for k, v in overrides.items()},
    }
    if "warmup-steps" not in layer:  # a short run must leave the schedule room to decay
        probe = load_config({**layer, "warmup-steps": 0})
        layer["warmup-steps"] = min(DeptConfig.warmup_steps, probe.total_steps - 1)
    return to_run_config(load_config(layer))
