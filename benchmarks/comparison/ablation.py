"""Why does GLOB lose to STD here? A factorial ablation of the federated protocol.

The committed comparison (``benchmarks/results/compare-tiny-nine``) ran every DEPT variant with
our defaults: each source keeps its AdamW moments across rounds, weight decay 0.1, 40 local
steps a round, FedAvg on the server. The paper's authors reset the inner optimizer every round,
use weight decay 0 and outer Nesterov 0.7/0.7. This runs the variants (default GLOB and SPEC)
under each factor's two levels, at the comparison's budget and data::

    inner   keep    | reset       (keep-inner-optimizer)
    wd      0.1     | 0           (weight-decay)
    local   40      | 10          (local-steps; rounds grow so the tokens stay the same)
    outer   fedavg  | nesterov    (outer-optimizer, lr 0.7, momentum 0.7)

``--design half`` (default) runs the 8 cells of the 2^(4-1) fraction with I = inner·wd·local·outer
(every main effect is free of the two-factor interactions); ``full`` runs all 16. Phase two
runs each method's best cell at half and double the rate, and further out while the best rate
is at an edge of what ran, so the best cell's rate is bracketed. Writes ``ablation.json``
(every run, with its curve), ``ablation.md`` (cells, main effects, rate bracket) and
``ablation.png`` (curves per cell) to ``--out``.

Run from the repository root: ``python -m benchmarks.comparison.ablation`` (about 80 min on 2 CPUs).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dept.config import DeptConfig, load_config, to_run_config
from dept.data.sources import run_sources
from dept.paths import resolve_path
from dept.state.strict_json import dumps
from dept_cli import compare
from dept_cli.compare_plan import Plan, base_config, make_plans, prepare, rounds_for
from dept_cli.comparison_report import STD_METHODS, average_bpb


@dataclass(frozen=True)
class Factor:
    """One protocol choice: its name, its two levels' labels and the run config of each."""

    name: str
    levels: tuple[str, str]  # (ours, the authors')
    settings: tuple[dict[str, Any], dict[str, Any]]


FACTORS = (
    Factor(
        "inner",
        ("keep", "reset"),
        ({"keep-inner-optimizer": True}, {"keep-inner-optimizer": False}),
    ),
    Factor("wd", ("0.1", "0"), ({"weight-decay": 0.1}, {"weight-decay": 0.0})),
    Factor("local", ("40", "10"), ({"local-steps": 40}, {"local-steps": 10})),
    Factor(
        "outer",
        ("fedavg", "nesterov"),
        (
            {"outer-optimizer": "fedavg", "outer-lr": 1.0},
            {"outer-optimizer": "nesterov", "outer-lr": 0.7, "outer-momentum": 0.7},
        ),
    ),
)


@dataclass(frozen=True)
class Cell:
    """One combination of levels: ``high[i]`` says whether factor i is at its second level."""

    high: tuple[bool, ...]

    @property
    def name(self) -> str:
        return "-".join(f"{f.name}={f.levels[h]}" for f, h in zip(FACTORS, self.high, strict=True))

    def overrides(self, tokens: float, sources: int, batch_size: int, seq_len: int) -> dict:
        """The cell's run config; rounds follow from the budget at the cell's local steps."""
        config: dict[str, Any] = {}
        for factor, high in zip(FACTORS, self.high, strict=True):
            config.update(factor.settings[high])
        config["num-server-rounds"] = rounds_for(
            tokens, sources, config["local-steps"], batch_size, seq_len
        )
        return config


def design(kind: str) -> list[Cell]:
    """The full 2^4 factorial, or its half with defining relation I = ABCD (an even number of
    factors at their second level), ours first."""
    cells = [Cell(high) for high in itertools.product((False, True), repeat=len(FACTORS))]
    return cells if kind == "full" else [c for c in cells if sum(c.high) % 2 == 0]


def main_effects(runs: Sequence[dict[str, Any]], method: str) -> dict[str, float]:
    """Per factor: mean final average bits per byte at its second level minus at its first,
    over the design's cells at the design's rate (negative: the authors' level is better)."""
    scored = [(r["cell"], average_bpb(r)) for r in runs if r["method"] == method]
    effects = {}
    for i, factor in enumerate(FACTORS):
        high = [s for c, s in scored if c[i] and math.isfinite(s)]
        low = [s for c, s in scored if not c[i] and math.isfinite(s)]
        effects[factor.name] = (
            statistics.mean(high) - statistics.mean(low) if high and low else math.nan
        )
    return effects


def oscillation(curve: Iterable[Sequence[float]]) -> float:
    """Sum of the rises in the per-round average bits per byte: 0 for a curve that only falls."""
    values = [v for _, v in curve]
    return sum(max(0.0, b - a) for a, b in itertools.pairwise(values))


def bracket_rates(tried: Iterable[float], best: float) -> list[float]:
    """The rates to run next so ``best`` has a tried rate on each side (factor-2 steps)."""
    tried = sorted(set(tried))
    wanted = []
    if best <= tried[0]:
        wanted.append(best / 2)
    if best >= tried[-1]:
        wanted.append(best * 2)
    return wanted


def _plans(
    args: argparse.Namespace,
    base: DeptConfig,
    sources: int,
    cell: Cell,
    lrs: list[float],
    out: Path,
) -> list[Plan]:
    """The cell's runs, at its rounds for the budget over ``sources`` sources."""
    cell_config = load_config(
        {
            **to_run_config(base),
            **cell.overrides(args.tokens, sources, args.batch_size, args.seq_len),
        }
    )
    plan_args = argparse.Namespace(methods=args.methods, lrs=lrs, jobs=args.jobs, seeds=1)
    return make_plans(plan_args, cell_config, out / cell.name)


def _run(
    args: argparse.Namespace,
    base: DeptConfig,
    sources: int,
    cells: list[tuple[Cell, list[float]]],
    out: Path,
) -> list[dict[str, Any]]:
    plans, plan_cells = [], []
    for cell, lrs in cells:
        for plan in _plans(args, base, sources, cell, lrs, out):
            plans.append(plan)
            plan_cells.append(cell)
    results = compare.run_all(plans, args.jobs)
    return [
        {
            **r,
            "cell": list(c.high),
            "cell_name": c.name,
            "oscillation": oscillation(r.get("curve", [])),
        }
        for r, c in zip(results, plan_cells, strict=True)
    ]


def reference_std(path: Path) -> float | None:
    """The best STD run's final average bits per byte in a committed comparison, if given."""
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    scores = [average_bpb(r) for m, r in report["methods"].items() if m in STD_METHODS]
    finite = [s for s in scores if math.isfinite(s)]
    return min(finite) if finite else None


def write_report(
    out: Path,
    runs: list[dict[str, Any]],
    args: argparse.Namespace,
    std: float | None,
    wall_s: float,
) -> None:
    """ablation.json, ablation.md and ablation.png."""
    effects = {m: main_effects([r for r in runs if r["lr"] == args.lr], m) for m in args.methods}
    (out / "ablation.json").write_text(
        dumps(
            {
                "factors": [
                    {"name": f.name, "levels": f.levels, "settings": f.settings} for f in FACTORS
                ],
                "design": args.design,
                "design_lr": args.lr,
                "reference_std_bpb": std,
                "main_effects": effects,
                "wall_s": wall_s,
                "runs": runs,
            },
            indent=2,
        )
    )
    (out / "ablation.md").write_text(render(runs, effects, args, std, wall_s))
    _plot(out / "ablation.png", runs, args)


def _vs_std(score: float, std: float | None) -> str:
    return f"{(score / std - 1) * 100:+.1f}%" if std and math.isfinite(score) else "n/a"


def render(
    runs: list[dict[str, Any]],
    effects: dict[str, dict[str, float]],
    args: argparse.Namespace,
    std: float | None,
    wall_s: float,
) -> str:
    """The tables: every cell at the design rate, the main effects, and the rate bracket."""
    names = [f.name for f in FACTORS]
    lines = [
        "# Ablation: why the federated variants lose to STD",
        "",
        f"Model `{args.model}`, budget {args.tokens:,.0f} tokens per run, design `{args.design}` "
        f"at lr {args.lr:g}; best STD (reference): {f'{std:.4f}' if std else 'n/a'}; "
        f"total wall time {wall_s / 60:.1f} min.",
        "",
        "## Cells (final average validation bits per byte; rises = sum of the curve's rises)",
        "",
        "| " + " | ".join(names) + " | method | lr | rounds | avg bpb | vs best STD | rises |",
        "|" + "---|" * (len(names) + 6),
    ]
    for r in sorted(runs, key=lambda r: (r["method"], average_bpb(r))):
        levels = [f.levels[h] for f, h in zip(FACTORS, r["cell"], strict=True)]
        score = average_bpb(r)
        lines.append(
            "| "
            + " | ".join(levels)
            + f" | {r['method']} | {r['lr']:g} | {len(r.get('curve', [])) - 1} | "
            + (f"{score:.4f}" if math.isfinite(score) else f"crashed: {r.get('error', '?')}")
            + f" | {_vs_std(score, std)} | {r['oscillation']:.3f} |"
        )
    lines += [
        "",
        f"## Main effects at lr {args.lr:g} (second level minus first, bits per byte)",
        "",
        "| method | "
        + " | ".join(f"{f.name}: {f.levels[1]} − {f.levels[0]}" for f in FACTORS)
        + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for method, row in effects.items():
        lines.append(f"| {method} | " + " | ".join(f"{row[n]:+.4f}" for n in names) + " |")
    lines += ["", "## Rates at each method's best cell", ""]
    for method in args.methods:
        finite = [r for r in runs if r["method"] == method and math.isfinite(average_bpb(r))]
        if finite:
            cell = min(finite, key=average_bpb)["cell_name"]
            rates = sorted((r["lr"], average_bpb(r)) for r in finite if r["cell_name"] == cell)
            shown = ", ".join(f"lr {lr:g}: {score:.4f}" for lr, score in rates)
            lines.append(f"- {method}, `{cell}`: {shown}")
    return "\n".join(lines) + "\n"


def _plot(path: Path, runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(args.methods), figsize=(6 * len(args.methods), 4.5), squeeze=False
    )
    for ax, method in zip(axes[0], args.methods, strict=True):
        for r in runs:
            if r["method"] == method and r["lr"] == args.lr and r.get("curve"):
                rounds, values = zip(*r["curve"], strict=True)
                steps = [x / max(rounds) for x in rounds]  # budget fraction: cells differ in rounds
                ax.plot(steps, values, label=r["cell_name"], linewidth=1)
        ax.set(
            title=f"{method} at lr {args.lr:g}",
            xlabel="fraction of the budget",
            ylabel="avg val bpb",
        )
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = resolve_path(args.out)
    base = base_config(
        compare.parse_args(
            [
                "--sources-file", args.sources_file, "--model", args.model,
                "--tokens", str(args.tokens), "--batch-size", str(args.batch_size),
                "--seq-len", str(args.seq_len), "--out", str(out),
            ]
        ),
        out,
    )  # fmt: skip
    sources = len(run_sources(base))  # read once: every cell's rounds depend on it
    cells = design(args.design)
    print(
        f"{len(cells)} cells x {len(args.methods)} methods at lr {args.lr:g}, {args.jobs} jobs",
        flush=True,
    )
    started = time.perf_counter()
    prepare(base)
    runs = _run(args, base, sources, [(c, [args.lr]) for c in cells], out)
    for method in args.methods:  # bracket the best cell's rate
        while True:
            mine = [r for r in runs if r["method"] == method and math.isfinite(average_bpb(r))]
            if not mine:
                break
            best_cell = min(mine, key=average_bpb)["cell"]
            at_cell = [r for r in mine if r["cell"] == best_cell]
            best_lr = min(at_cell, key=average_bpb)["lr"]
            wanted = bracket_rates([r["lr"] for r in at_cell], best_lr)
            if not wanted or len(at_cell) >= args.max_rates:
                break
            single = argparse.Namespace(**{**vars(args), "methods": [method]})
            runs += _run(single, base, sources, [(Cell(tuple(best_cell)), wanted)], out)
    write_report(
        out, runs, args, reference_std(resolve_path(args.reference)), time.perf_counter() - started
    )
    print(f"wrote {out / 'ablation.md'}, ablation.json and ablation.png", flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.comparison.ablation", description=__doc__
    )
    parser.add_argument("--sources-file", default="benchmarks/corpora.yaml")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tokens", type=float, default=5.5e5, help="training tokens per run")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--methods", type=lambda s: s.split(","), default=["glob", "spec"])
    parser.add_argument("--lr", type=float, default=0.004, help="the design's inner rate")
    parser.add_argument("--max-rates", type=int, default=5, help="rates at most at the best cell")
    parser.add_argument("--design", choices=("half", "full"), default="half")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--reference",
        default="benchmarks/results/compare-tiny-nine/comparison.json",
        help="a comparison.json whose best STD the table measures against",
    )
    parser.add_argument("--out", default="outputs/ablation")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
