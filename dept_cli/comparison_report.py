"""The comparison's outputs: ``comparison.md`` (tables), ``comparison.json``, ``comparison.png``.

A result is one run, normalised by :mod:`dept_cli.compare`: per-source final bits per byte
and perplexity, the per-round average curve, bytes communicated and the data-parallel
reference, embedding parameters per source, tokens trained, its rounds and the bytes of text
those tokens hold (``text_bytes``, where measured), wall time; or an ``error``;
and, crashed or not, the vocabulary sizes it was run with (global, and per source).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dept.config import DeptConfig, to_run_config
from dept.state.strict_json import dumps
from dept_cli.methods import BASELINES, FEDERATED, own_tokenizer, title

STD_METHODS = tuple(m for m, b in BASELINES.items() if not b.forgets)  # the reference runs
SPREAD = "avg_bpb_sd"  # a result pooled over seeds (dept_cli.seeds): the average's sd


def average_bpb(result: dict[str, Any]) -> float:
    """Mean final bits per byte over sources; NaN if the run crashed or any source is missing."""
    values = [s.get("val_bpb") for s in result.get("sources", {}).values()]
    if not values or not all(isinstance(v, float) and math.isfinite(v) for v in values):
        return math.nan
    return sum(values) / len(values)


def best_per_method(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each method's run with the lowest final average bits per byte (a crash if all crashed)."""
    best: dict[str, dict[str, Any]] = {}
    for result in results:
        current = best.get(result["method"])
        score = average_bpb(result)
        # "not <=" so a finite score beats a crashed (NaN) one
        if current is None or (math.isfinite(score) and not average_bpb(current) <= score):
            best[result["method"]] = result
    return best


def write_report(
    out: Path,
    cfg: DeptConfig,
    results: list[dict[str, Any]],
    best: dict[str, dict[str, Any]],
    wall_s: float,
    budget: str = "tokens",
    runs: list[dict[str, Any]] | None = None,
) -> None:
    """``results``: one per method and rate (pooled over seeds); ``runs``: every seed's run,
    kept in comparison.json where several seeds ran."""
    methods = list(best)
    (out / "comparison.json").write_text(
        dumps(
            {
                "config": to_run_config(cfg),
                "wall_s": wall_s,
                "budget": budget,
                "methods": {m: best[m] for m in methods},
                "sweep": results,
                **({"runs": runs} if runs and len(runs) > len(results) else {}),
            },
            indent=2,
        )
    )
    (out / "comparison.md").write_text(render_markdown(cfg, results, best, wall_s, budget))
    plot_curves(out / "comparison.png", best, cfg)


def render_markdown(
    cfg: DeptConfig,
    results: list[dict[str, Any]],
    best: dict[str, dict[str, Any]],
    wall_s: float,
    budget: str = "tokens",
) -> str:
    methods = list(best)
    sources = sorted({s for r in best.values() for s in r.get("sources", {})})
    lrs = sorted({r["lr"] for r in results})
    tokens = max((r.get("tokens", 0) for r in best.values()), default=0)
    lines = [
        "# DEPT variants vs baselines",
        "",
        f"Model `{cfg.model}`, {len(sources)} sources, {cfg.num_server_rounds} rounds x "
        f"{cfg.local_steps} local steps (batch {cfg.batch_size} x {cfg.seq_len} tokens per "
        f"source), {tokens:,} training tokens per run, {_budget_note(budget)}, "
        f"{_seeds_note(results, cfg.seed)}, outer optimizer "
        f"`{cfg.outer_optimizer}` (lr {cfg.outer_lr:g}), validation: the first "
        f"{cfg.eval_bytes:,} bytes of each source's validation text. Every method ran at "
        f"learning rates {', '.join(f'{lr:g}' for lr in lrs)}; each column is its best "
        f"rate (lowest final average bits per byte). Total wall time {wall_s / 60:.1f} min.",
        "",
        f"Vocabularies: one global tokenizer of {cfg.global_vocab_size:,} tokens for the "
        "methods that share it; each source's own of its vocab-size for the others (the "
        "global size where the sources file gives none, see `compared-sources.yaml`).",
        "",
        "## Validation bits per byte (lower is better; best per row in bold)",
        "",
        _table(
            ["source", *(title(m) for m in methods)],
            [
                *(
                    [name, *_bold_min([_source_bpb(best[m], name) for m in methods])]
                    for name in sources
                ),
                [
                    "**average**",
                    *(
                        cell + _spread(best[m])
                        for cell, m in zip(
                            _bold_min([average_bpb(best[m]) for m in methods]), methods, strict=True
                        )
                    ),
                ],
                ["average before training (round 0)", *(_num(_before(best[m])) for m in methods)],
            ],
        ),
        "",
        "The round-0 row is each method's model before any training, through its own "
        "tokenizer: what a vocabulary alone gives (fewer, longer tokens can start lower).",
        "",
        "## Vocabulary size",
        "",
        _table(["", *(title(m) for m in methods)], _vocab_rows(best, methods)),
        "",
        "## Cost",
        "",
        _table(["", *(title(m) for m in methods)], _cost_rows(best, methods)),
        "",
        "## Perplexity per token (only where the tokenizer is shared)",
        "",
        _table(
            ["source", *(title(m) for m in methods)],
            [
                [
                    name,
                    *(
                        "n/a (own tokenizer)" if own_tokenizer(m) else _num(_ppl(best[m], name))
                        for m in methods
                    ),
                ]
                for name in sources
            ],
        ),
        "",
        "## Learning-rate sweep (final average bits per byte)",
        "",
        _table(
            ["method", *(f"lr {lr:g}" for lr in lrs)],
            [[title(m), *(_sweep_cell(results, m, lr) for lr in lrs)] for m in methods],
        ),
        "",
    ]
    return "\n".join(lines)


def _cost_rows(best: dict[str, dict[str, Any]], methods: list[str]) -> list[list[str]]:
    std = [average_bpb(best[m]) for m in STD_METHODS if m in best]
    best_std = min((v for v in std if math.isfinite(v)), default=math.nan)

    def each(fn: Any) -> list[str]:
        return [fn(best[m]) if "error" not in best[m] else "crashed" for m in methods]

    def gap_to_std(result: dict[str, Any]) -> str:
        if not math.isfinite(best_std):
            return "n/a (no STD ran)"
        return f"{(average_bpb(result) / best_std - 1) * 100:+.1f}%"

    return [
        ["learning rate", *each(lambda r: f"{r['lr']:g}")],
        ["avg bpb vs best STD", *each(gap_to_std)],
        ["bytes communicated", *each(lambda r: _bytes(r["bytes"]))],
        ["reduction vs data-parallel", *each(lambda r: f"{r['bytes_ddp'] / r['bytes']:.1f}x")],
        [
            "embedding params per source",
            *each(lambda r: f"{_mean(r['embedding_params'].values()):,.0f}"),
        ],
        ["rounds", *each(lambda r: str(r.get("rounds", "")))],
        ["tokens trained", *each(lambda r: f"{r['tokens']:,}")],
        ["bytes of text trained", *each(_text_bytes)],
        ["failed or rejected replies", *each(lambda r: str(r["failed"]))],
        ["wall time (s)", *each(lambda r: f"{r['wall_s']:.0f}")],
    ]


def _seeds_note(results: list[dict[str, Any]], seed: int) -> str:
    counts = {len(r.get("seeds") or [None]) for r in results}
    if counts == {1}:
        return f"seed {seed}"
    return (
        f"seeds {seed} to {seed + max(counts) - 1} per method and rate (bits per byte: the "
        "mean over seeds; ± the standard deviation of the average)"
    )


def _budget_note(budget: str) -> str:
    if budget == "bytes":
        return "budget: the same bytes of text per method (rounds below; SPEC-OPT fewer)"
    return "budget: the same tokens per method"


def _text_bytes(result: dict[str, Any]) -> str:
    count = result.get("text_bytes")
    return f"{count:,}" if isinstance(count, int) else "n/a"


def _vocab_rows(best: dict[str, dict[str, Any]], methods: list[str]) -> list[list[str]]:
    """What each method's tokenizers held: a smaller vocabulary alone moves bits per byte."""
    return [
        ["tokenizer", *("own per source" if own_tokenizer(m) else "global" for m in methods)],
        ["per source", *(size_range(best[m]["source_vocab_sizes"].values()) for m in methods)],
        [
            "global (--global-vocab-size)",
            *(
                f"{best[m]['global_vocab_size']:,}{' (not used)' if own_tokenizer(m) else ''}"
                for m in methods
            ),
        ],
    ]


def size_range(sizes: Iterable[int]) -> str:
    """``4,096`` when every source has that size, else ``2,048–4,096``."""
    values = list(sizes)
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _source_bpb(result: dict[str, Any], name: str) -> float:
    if name == "**average**":
        return average_bpb(result)
    return result.get("sources", {}).get(name, {}).get("val_bpb", math.nan)


def _before(result: dict[str, Any]) -> float:
    """The average bits per byte of round 0 (before training); NaN where not scored."""
    for number, value in result.get("curve", []):
        if number == 0 and value is not None:
            return float(value)
    return math.nan


def _ppl(result: dict[str, Any], name: str) -> float:
    return result.get("sources", {}).get(name, {}).get("val_ppl", math.nan)


def _bold_min(values: list[float]) -> list[str]:
    finite = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    low = min(finite, default=math.nan)
    return [f"**{v:.4f}**" if v == low else _num(v) for v in values]


def _num(value: float) -> str:
    return f"{value:.4f}" if isinstance(value, float) and math.isfinite(value) else "crashed"


def _sweep_cell(results: list[dict[str, Any]], method: str, lr: float) -> str:
    for r in results:
        if r["method"] == method and r["lr"] == lr:
            return f"crashed: {r['error']}" if "error" in r else _num(average_bpb(r)) + _spread(r)
    return ""


def _spread(result: dict[str, Any]) -> str:
    """ " ± sd (n seeds)" for a result pooled over seeds, else nothing."""
    spread = result.get(SPREAD)
    return "" if spread is None else f" ± {spread:.4f} ({len(result['seeds'])} seeds)"


def _bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000:
            return f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def plot_curves(path: Path, best: dict[str, dict[str, Any]], cfg: DeptConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for method, result in best.items():
        points = [(r, v) for r, v in result.get("curve", []) if v is not None]
        if points:
            style = "-" if method in FEDERATED else "--"
            ax.plot(
                *zip(*points, strict=True),
                style,
                marker="o",
                label=f"{title(method)} (lr {result['lr']:g})",
            )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"round ({cfg.local_steps} steps each; 0 = before training)")
    ax.set_ylabel("average validation bits per byte")
    ax.set_title(f"DEPT variants vs baselines, model {cfg.model}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
