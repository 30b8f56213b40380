"""Which part of ``embedding-rows=seen`` helps GLOB and TRIM, and what tying costs them.

Each cell is a set of methods under one run config, trained like ``dept compare`` (same data,
budget and protocol, one rate, ``--seeds`` seeds) into ``OUT/<cell>/``; a finished run is
reused, so an interrupted ablation goes on where it stopped. The cells:

- ``all``: every φ row goes up every round (the rule as the paper states it), with STD τ=0.3
  and SPEC beside it as the references;
- ``seen``: only the rows of the tokens a source's round held, each averaged over its senders;
- ``zero-filled``: the dropping half alone: unseen rows go up as a zero update, so each row is
  still divided among every source (``embedding-rows=seen-zero-filled``);
- ``seen-occurrences``: ``seen`` with each row weighted by its token's count in the round, not
  by the source's tokens (``embedding-row-weight``);
- ``seen-frozen``: ``seen`` where the rows not seen yet stay put in local training
  (``unseen-rows=freeze``), not trained and then left out of the reply;
- ``untied-all``, ``untied-seen``: the same with untied input and output embeddings, STD and
  SPEC beside them.

For every GLOB and TRIM run it also reads ``metrics.jsonl``: per round, the RMS of each
source's φ update over the rows its round saw and over the rest, and how many it saw. Writes
``embedding_rows.json`` (every run), ``embedding_rows.md`` (mean ± sd per cell and method,
against STD τ=0.3 in the same tying; the update sizes) and ``embedding_rows.png``::

    python -m benchmarks.comparison.embedding_rows --sources-file SOURCES --out OUT
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dept.config import load_config, to_run_config
from dept.paths import resolve_path
from dept.state.jsonl import read_lines
from dept.state.strict_json import dumps
from dept_cli import compare
from dept_cli.compare_plan import Plan, base_config, make_plans, prepare
from dept_cli.comparison_report import average_bpb

SHARED = ("glob", "trim")  # the methods whose φ rows travel
REFERENCES = ("std-0.3", "spec")


@dataclass(frozen=True)
class Cell:
    """A name, the methods it runs, and the run config they run under."""

    name: str
    methods: tuple[str, ...]
    settings: dict[str, Any]

    @property
    def tied(self) -> bool:
        return bool(self.settings.get("tie-embeddings", True))


CELLS = (
    Cell("all", (*SHARED, *REFERENCES), {"embedding-rows": "all"}),
    Cell("seen", SHARED, {"embedding-rows": "seen"}),
    Cell("zero-filled", SHARED, {"embedding-rows": "seen-zero-filled"}),
    Cell(
        "seen-occurrences",
        SHARED,
        {"embedding-rows": "seen", "embedding-row-weight": "occurrences"},
    ),
    Cell("seen-frozen", SHARED, {"embedding-rows": "seen", "unseen-rows": "freeze"}),
    Cell(
        "untied-all",
        ("glob", *REFERENCES),
        {"embedding-rows": "all", "tie-embeddings": False},
    ),
    Cell("untied-seen", ("glob",), {"embedding-rows": "seen", "tie-embeddings": False}),
)


def update_sizes(run_dir: Path) -> dict[str, float]:
    """A GLOB or TRIM run's φ updates over its rounds and sources: the mean RMS over the rows
    a round saw and over the others, and how many rows a round saw (NaN where the run
    recorded none)."""
    seen, unseen, share = [], [], []
    path = run_dir / "metrics.jsonl"
    for row in read_lines(path) if path.is_file() else []:
        for source in row["sources"].values():
            if source.get("embedding_rows_seen", 0) > 0:
                seen.append(source["embedding_update_seen_rms"])
                unseen.append(source["embedding_update_unseen_rms"])
                share.append(source["embedding_rows_seen"])
    return {"seen_rms": _mean(seen), "unseen_rms": _mean(unseen), "rows_seen": _mean(share)}


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell and method: mean and sd of the final average bits per byte over its seeds,
    its gap to STD τ=0.3 of the same tying, and its mean update sizes."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["cell"], run["method"]), []).append(run)
    std = {
        tied: _mean(
            [average_bpb(r) for r in runs if r["method"] == "std-0.3" and r["tied"] == tied]
        )
        for tied in (True, False)
    }
    rows = []
    for (cell, method), group in groups.items():
        scores = [average_bpb(r) for r in group if math.isfinite(average_bpb(r))]
        mean = statistics.fmean(scores) if scores else math.nan
        reference = std[group[0]["tied"]]
        sizes = {k: _mean([r["update_sizes"][k] for r in group]) for k in group[0]["update_sizes"]}
        rows.append(
            {
                "cell": cell,
                "method": method,
                "tied": group[0]["tied"],
                "seeds": len(scores),
                "mean": mean,
                "sd": statistics.stdev(scores) if len(scores) > 1 else math.nan,
                "vs_std": mean / reference - 1 if math.isfinite(reference) else math.nan,
                **sizes,
            }
        )
    return rows


def render(rows: list[dict[str, Any]], args: argparse.Namespace, wall_s: float) -> str:
    lines = [
        "# GLOB and TRIM: which embedding rows a source's round sends",
        "",
        f"Model `{args.model}`, {args.tokens:,.0f} training tokens a run, {args.local_steps} "
        f"local steps a round, lr {args.lr:g}, seeds {args.seed} to {args.seed + args.seeds - 1}, "
        f"sources `{args.sources_file}`; total wall time {wall_s / 60:.1f} min.",
        "",
        "## Final average validation bits per byte (mean ± sd over seeds)",
        "",
        "| cell | tied | method | bits per byte | vs STD τ=0.3 (same tying) |",
        "|---|---|---|---:|---:|",
    ]
    for row in rows:
        sd = f" ± {row['sd']:.4f}" if math.isfinite(row["sd"]) else ""
        gap = f"{row['vs_std'] * 100:+.1f}%" if math.isfinite(row["vs_std"]) else "n/a"
        tied = "yes" if row["tied"] else "no"
        lines.append(
            f"| {row['cell']} | {tied} | {row['method']} | {row['mean']:.4f}{sd} | {gap} |"
        )
    lines += [
        "",
        "## The φ update on the rows a round saw and on the rest",
        "",
        "RMS per source and round, the mean over rounds and sources.",
        "",
        f"| cell | method | rows a round saw (of {args.global_vocab_size:,}) | seen rows | "
        "unseen rows | unseen / seen |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        if not math.isfinite(row["seen_rms"]):
            continue
        ratio = row["unseen_rms"] / row["seen_rms"] if row["seen_rms"] else math.nan
        lines.append(
            f"| {row['cell']} | {row['method']} | {row['rows_seen']:.0f} | "
            f"{row['seen_rms']:.2e} | {row['unseen_rms']:.2e} | {ratio:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['cell']}\n{r['method']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows)), 4.5))
    sd = [r["sd"] if math.isfinite(r["sd"]) else 0.0 for r in rows]
    ax.bar(range(len(rows)), [r["mean"] for r in rows], yerr=sd, capsize=3)
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    low = min(r["mean"] - s for r, s in zip(rows, sd, strict=True))
    ax.set_ylim(bottom=low * 0.97)
    ax.set(ylabel="final avg val bits per byte", title="embedding rows: cells x methods")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plans(args: argparse.Namespace, out: Path) -> list[tuple[Cell, Plan]]:
    base = base_config(
        compare.parse_args(
            [
                "--sources-file", args.sources_file, "--model", args.model,
                "--tokens", str(args.tokens), "--local-steps", str(args.local_steps),
                "--outer-optimizer", "nesterov", "--outer-lr", "0.7", "--outer-momentum", "0.7",
                "--seed", str(args.seed), "--global-vocab-size", str(args.global_vocab_size),
                "--out", str(out),
                "-c", "weight-decay=0.0 keep-inner-optimizer=true",
            ]
        ),
        out,
    )  # fmt: skip
    prepare(base)
    wanted = [c for c in CELLS if c.name in args.cells]
    plans = []
    for cell in wanted:
        config = load_config({**to_run_config(base), **cell.settings})
        plan_args = argparse.Namespace(
            methods=list(cell.methods), lrs=[args.lr], jobs=args.jobs, seeds=args.seeds
        )
        plans += [(cell, p) for p in make_plans(plan_args, config, out / cell.name)]
    return plans


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = resolve_path(args.out)
    started = time.perf_counter()
    plans = _plans(args, out)
    print(f"{len(plans)} runs in {len(args.cells)} cells, {args.jobs} jobs", flush=True)
    results = compare.run_all([p for _, p in plans], args.jobs)
    runs = [
        {
            **result,
            "cell": cell.name,
            "tied": cell.tied,
            "update_sizes": update_sizes(Path(plan.out_dir)),
        }
        for (cell, plan), result in zip(plans, results, strict=True)
    ]
    rows = summarise(runs)
    wall_s = time.perf_counter() - started
    (out / "embedding_rows.json").write_text(
        dumps({"cells": [vars(c) for c in CELLS], "summary": rows, "runs": runs}, indent=2)
    )
    (out / "embedding_rows.md").write_text(render(rows, args, wall_s))
    plot(out / "embedding_rows.png", rows)
    print(f"wrote {out / 'embedding_rows.md'}, embedding_rows.json and .png", flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.comparison.embedding_rows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sources-file", required=True)
    parser.add_argument("--model", default="debug")
    parser.add_argument("--tokens", type=float, default=2.05e5, help="training tokens per run")
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.004)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--global-vocab-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument(
        "--cells",
        type=lambda s: s.split(","),
        default=[c.name for c in CELLS],
        help="comma-separated subset of: " + ", ".join(c.name for c in CELLS),
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="outputs/embedding-rows")
    args = parser.parse_args(argv)
    unknown = set(args.cells) - {c.name for c in CELLS}
    if unknown:
        parser.error(f"unknown cells {sorted(unknown)}")
    return args


if __name__ == "__main__":
    raise SystemExit(main())
