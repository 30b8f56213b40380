"""A comparison's runs of one method and rate under several seeds (``dept compare --seeds N``)
as one result: per-source means, and the spread of the average across seeds.

A gap between two methods under about 1% is unreadable from one seed each (the measured
noise floor was 0.3-0.7%); with N seeds each, the table says mean ± standard deviation and a
gap can be read against it. Seed ``base + i`` runs in ``runs/<method>-lr<rate>-seed<s>``
for i > 0, so the first seed's folder is that of a one-seed comparison, whose finished runs
are reused.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from dept_cli.comparison_report import SPREAD, average_bpb


def run_folder(method: str, lr: float, seed: int, base_seed: int) -> str:
    """The run's folder under ``runs/``; the base seed's is a one-seed comparison's."""
    name = f"{method}-lr{lr:g}"
    return name if seed == base_seed else f"{name}-seed{seed}"


def pool_seeds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per (method, rate), in first-seen order: the first seed's, with each
    source's bits per byte and perplexity and the per-round curve the mean over the seeds
    that finished, its ``seeds`` and, with two or more, :data:`SPREAD`. A rate where any
    seed crashed keeps the crash: a mean over the survivors would hide it."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for result in results:
        groups.setdefault((result["method"], result["lr"]), []).append(result)
    return [_pooled(runs) for runs in groups.values()]


def _pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    seeds = [r.get("seed") for r in runs]
    crashed = [r for r in runs if "error" in r]
    if crashed or len(runs) == 1:
        return {**(crashed or runs)[0], "seeds": seeds}
    sources = {
        name: {
            key: statistics.fmean(r["sources"][name][key] for r in runs)
            for key in ("val_bpb", "val_ppl")
        }
        for name in runs[0]["sources"]
    }
    averages = [average_bpb(r) for r in runs]
    spread = statistics.stdev(averages) if all(map(math.isfinite, averages)) else math.nan
    pooled = {**runs[0], "sources": sources, "seeds": seeds, SPREAD: spread}
    return pooled | {"curve": _mean_curve(runs)}


def _mean_curve(runs: list[dict[str, Any]]) -> list[tuple[int, float | None]]:
    """The per-round average bits per byte, the mean over the seeds that scored each round
    (None where none did)."""
    by_round: dict[int, list[float]] = {}
    for run in runs:
        for number, value in run.get("curve", []):
            if value is not None and math.isfinite(value):
                by_round.setdefault(number, []).append(value)
            else:
                by_round.setdefault(number, [])
    return [(n, statistics.fmean(v) if v else None) for n, v in sorted(by_round.items())]
