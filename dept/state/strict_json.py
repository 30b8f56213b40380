"""Strict JSON for what a run writes (metrics, summaries, checkpoints' records): a missing
or non-finite number is written as null, never as ``NaN``, which other JSON readers refuse.

Its own module so that the code reading those files (``dept run``'s checks of a folder
before a run) need not import the run's report, and torch with it."""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(obj: Any, indent: int | None = None) -> str:
    """``obj`` as strict JSON: non-finite floats, at any depth, become null."""
    return json.dumps(finite(obj), indent=indent, allow_nan=False)


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (in dicts, lists and tuples too) as None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj
