"""Elapsed time counted from the user's command, not from when the ServerApp got going.

A ``dept run`` spends its first tens of seconds before round 0 (its checks, the SuperLink,
the simulation runtime, the ClientApps' imports); a round line that counted from the
ServerApp's start said "2 s elapsed" 44 s after the command. ``dept run`` hands its own
process's start time to the ServerApp in :data:`LAUNCHED_AT_VARIABLE` (the local SuperLink
and the simulation it starts inherit the environment); a ServerApp started otherwise (a
deployment, an in-process federation) counts from its own start, as before.
"""

from __future__ import annotations

import os
import time

import psutil

LAUNCHED_AT_VARIABLE = "DEPT_LAUNCHED_AT"  # seconds since the epoch, when dept run started


def process_started_at() -> float:
    """When this process started (before its imports), in seconds since the epoch."""
    return float(psutil.Process().create_time())


def since_launch() -> float | None:
    """Seconds since the ``dept run`` that started this run, or None where none did."""
    try:
        return time.time() - float(os.environ[LAUNCHED_AT_VARIABLE])
    except (KeyError, ValueError):
        return None


def stamped(line: str) -> str:
    """``line`` with the wall-clock time in front: when it reached the terminal."""
    return f"{time.strftime('%H:%M:%S')} {line}"
