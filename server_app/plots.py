"""What every line plot of a run shares: integer rounds on x, a grid, a legend, the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_line_plot(fig: Any, ax: Any, path: Path, *, xlabel: str, ylabel: str, title: str) -> Path:
    """Label ``ax`` of ``fig`` (a matplotlib figure on the Agg backend), save it to
    ``path`` and close it; returns ``path``."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
