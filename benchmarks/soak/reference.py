"""The fault-free run a soak is compared with: the same run config (read from the soak's
checkpoint), the same sources and node settings, driven in process (``LocalGrid``) rather
than through the deployment, which computes the same numbers: sampling and aggregation go
by source name, never by node id or arrival order.

Run as its own process (``python -m benchmarks.soak.reference RUN_DIR OUT_DIR``) with one
thread, as the deployment's trainers run, so float sums are made in the same order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from server_app.checkpoint import saved_run_config

VOCAB_SIZE = 300  # as tests/deploy/test_deployment.py's node_config gives every node


def node_configs(sources: tuple[str, ...], state: Path) -> list[dict[str, Any]]:
    """The deployment's node configs, with the work done in process (no warm worker)."""
    return [
        {
            "source": s,
            "path": f"builtin:synthetic-{s}",
            "vocab-size": VOCAB_SIZE,
            "state-dir": str(state / s),
            "warm-worker": "false",
        }
        for s in sources
    ]


def run_reference(run_dir: Path, out: Path, sources: tuple[str, ...]) -> Path:
    """Train the fault-free twin of the run in ``run_dir`` into ``out/run``; its folder."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "benchmarks.soak.reference", str(run_dir), str(out)]
    subprocess.run([*command, *sources], check=True, env=env, timeout=1800)
    return out / "run"


def main(argv: list[str]) -> None:
    from client_app.app import app as client_app  # torch and co., only in this process
    from server_app.federation import run_federation
    from server_app.local_grid import LocalGrid

    run_dir, out, sources = Path(argv[0]), Path(argv[1]), tuple(argv[2:])
    saved = saved_run_config(run_dir)
    if saved is None:
        raise SystemExit(f"{run_dir} holds no checkpoint to read the run config from")
    config = {**saved[1], "resume": False, "output-dir": str(out / "run")}
    grid = LocalGrid(client_app, node_configs(sources, out / "state"), config)
    run_federation(grid, config)


if __name__ == "__main__":
    main(sys.argv[1:])
