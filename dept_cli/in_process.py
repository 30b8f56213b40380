"""The federation in this process: the real ServerApp and ClientApp code, one node per source.

What ``dept compare``, ``dept cpt`` and the benchmarks run instead of the Flower runtime
(``LocalGrid`` calls the ClientApp directly): seconds to start, not Ray's half minute.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dept.config import load_config
from dept.data.sources import run_sources

if TYPE_CHECKING:
    from server_app.local_grid import LocalGrid


def federate_in_process(run_config: dict[str, Any], grid: LocalGrid | None = None) -> Path:
    """Run the federation of ``run_config``; returns its output folder. ``grid``: one made by
    :func:`in_process_grid` (e.g. a subclass that measures), else a plain one."""
    from server_app.federation import run_federation

    return run_federation(grid or in_process_grid(run_config), run_config).out_dir


def in_process_grid(
    run_config: dict[str, Any], grid_type: type[LocalGrid] | None = None, **kwargs: Any
) -> LocalGrid:
    """A grid of one in-process node per source of ``run_config``, serving the real ClientApp;
    ``kwargs`` go to ``grid_type`` (default: ``LocalGrid``)."""
    from client_app.app import app as client_app
    from server_app.local_grid import LocalGrid

    count = len(run_sources(load_config(run_config)))
    nodes = [{"partition-id": i, "num-partitions": count} for i in range(count)]
    return (grid_type or LocalGrid)(client_app, nodes, run_config, **kwargs)
