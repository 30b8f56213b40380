"""Where a node keeps its state unless told otherwise; light, so a thin ClientApp can ask."""

from __future__ import annotations

import os
from pathlib import Path


def default_state_root() -> Path:
    """``$XDG_CACHE_HOME/dept`` (``~/.cache/dept``): node-local, survives restarts."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dept"
