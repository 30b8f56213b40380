"""The run's diagnostics in ``summary.json`` and in two plots: how far each source's local
model drifts from the averaged one (``drift.png``, with ``drift-eval``) and how its update
interferes with the others' (``interference.png``, a heat map per shown round).

What a round measured is in its ``metrics.jsonl`` line (:meth:`RunHistory.round_json`:
``drift``, ``update_norms``, ``interference``); this module only summarises and draws it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from dept_strategy.history import RunHistory
from server_app.plots import save_line_plot

DRIFT_PLOT = "drift.png"
INTERFERENCE_PLOT = "interference.png"
GROUPS = {"theta": "θ (body)", "phi": "φ (embeddings)"}


def diagnostics_summary(history: RunHistory) -> dict[str, Any]:
    """Means over the trained rounds: the off-diagonal cosine (θ, φ), the update norm, and
    (with drift-eval) bits per byte before and after averaging and their difference."""
    rounds = [history.round_json(r) for r in sorted(history.rounds) if history.rounds[r].train]
    cosines = {
        g: _mean(line["interference"].get(f"{g}_mean_offdiag") for line in rounds) for g in GROUPS
    }
    norms = {
        g: _mean(n.get(g) for line in rounds for n in line["update_norms"].values()) for g in GROUPS
    }
    drifts = [d for line in rounds for d in line.get("drift", {}).values()]
    return {
        "mean_offdiag_cosine": cosines,
        "mean_update_norm": norms,
        "mean_local_val_bpb": _mean(d["before"] for d in drifts),
        "mean_averaged_val_bpb": _mean(d["after"] for d in drifts),
        "mean_drift": _mean(d["drift"] for d in drifts),
        "server_s": sum(r.diagnostics_s for r in history.rounds.values()),
    }


def _mean(values: Any) -> float:
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def plot_diagnostics(history: RunHistory, out_dir: Path, title: str) -> list[Path]:
    """Draw what the run measured; the plots written (none where nothing was measured)."""
    import matplotlib

    matplotlib.use("Agg")
    lines = [history.round_json(r) for r in sorted(history.rounds)]
    written = []
    if any(line.get("drift") for line in lines):
        written.append(_plot_drift(lines, out_dir / DRIFT_PLOT, title))
    shown = [line for line in lines if line["interference"].get("sources")]
    if shown:
        written.append(_plot_interference(shown, out_dir / INTERFERENCE_PLOT, title))
    return written


def _plot_drift(lines: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Per round, the mean over sources of bits per byte before and after averaging."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, style, label in (
        ("before", "o-", "own local model, before averaging"),
        ("after", "s--", "averaged model, after the round"),
    ):
        points = [
            (line["round"], _mean(d[key] for d in line["drift"].values()))
            for line in lines
            if line.get("drift")
        ]
        ax.plot(*zip(*points, strict=True), style, label=label)
    return save_line_plot(
        fig,
        ax,
        path,
        xlabel="round",
        ylabel="validation bits per byte (mean over sources)",
        title=f"client drift — {title}",
    )


def _plot_interference(lines: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Heat maps of the pairwise cosines of the first, middle and last measured rounds,
    a row per group (θ; φ where shared)."""
    import matplotlib.pyplot as plt

    picked = sorted({0, len(lines) // 2, len(lines) - 1})
    groups = [g for g in GROUPS if g in lines[0]["interference"]]
    fig, axes = plt.subplots(
        len(groups),
        len(picked),
        figsize=(3.6 * len(picked) + 1, 3.4 * len(groups)),
        squeeze=False,
        layout="constrained",
    )
    images = []
    for row, group in enumerate(groups):
        for col, index in enumerate(picked):
            inter = lines[index]["interference"]
            ax, names = axes[row][col], inter["sources"]
            # A pair with no cosine (a source with no update) is NaN, or null where the
            # round came back from a checkpoint's strict JSON: a blank cell either way.
            cosines = np.array(inter[group], dtype=float)
            images.append(ax.imshow(cosines, vmin=-1, vmax=1, cmap="RdBu_r"))
            ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
            ax.set_yticks(range(len(names)), names, fontsize=6)
            mean = inter.get(f"{group}_mean_offdiag")
            shown = "–" if mean is None or not math.isfinite(mean) else f"{mean:.2f}"
            ax.set_title(
                f"{GROUPS[group]}, round {lines[index]['round']}\nmean off-diag {shown}",
                fontsize=8,
            )
    fig.colorbar(images[0], ax=axes, shrink=0.8, label="cosine of pseudo-gradients")
    fig.suptitle(f"interference — {title}", fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
