"""Where a node keeps its state unless told otherwise, and how a configured path resolves;
light (no omegaconf, no torch), so the thin ClientApp of every deployment message can ask."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BASE_DIR_ENV = "DEPT_HOME"


def default_state_root() -> Path:
    """``$XDG_CACHE_HOME/dept`` (``~/.cache/dept``): node-local, survives restarts."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dept"


def base_dir() -> Path:
    """Where relative run-config paths resolve: ``$DEPT_HOME`` if set, else the working dir."""
    return Path(os.environ.get(BASE_DIR_ENV) or os.getcwd())


def resolve_path(value: str, base: Path | None = None) -> Path:
    """Expand ``~`` and make ``value`` absolute against ``base`` (default :func:`base_dir`)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base or base_dir()) / path


def state_root(node_config: Mapping[str, Any], run_state_dir: object) -> Path:
    """Where a node keeps its state: its own ``state-dir`` node-config key, else the run
    config's, else :func:`default_state_root`."""
    state = node_config.get("state-dir") or run_state_dir
    return resolve_path(str(state)) if state else default_state_root()
