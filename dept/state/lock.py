"""One run per output folder: a lock file in it, held with ``flock`` while the run lives.

Two runs writing one folder corrupt it (shared temporary folders, one run's config beside the
other's results), so the second must stop at once and say who holds the folder. The kernel
drops an ``flock`` when its process dies, so a crashed run never blocks the next one; what
the dead holder wrote into the lock file is reported as a stale lock taken over.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dept.config import ConfigError

log = logging.getLogger(__name__)
LOCK_FILE = ".dept-run.lock"


class FolderInUse(ConfigError):
    """Another living process holds the folder's lock; the message names it."""


def usable_folder(folder: Path, key: str) -> Path:
    """``folder``, created if missing; a :class:`ConfigError` naming ``key`` when it is a
    file, cannot be created or cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"config key '{key}': cannot use {folder} as a folder: {exc}") from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"config key '{key}': {folder} is not writable by this user")
    return folder


@contextlib.contextmanager
def exclusive_folder(folder: Path, key: str = "output-dir") -> Iterator[None]:
    """Hold ``folder`` for this process until the block ends, or raise :class:`FolderInUse`."""
    descriptor = _lock(usable_folder(folder, key), key)
    try:
        previous = _read(descriptor)
        if previous:
            log.warning(
                "%s: taking over the stale lock of %s (that process is gone)",
                folder,
                _describe(previous),
            )
        _write(descriptor, _holder())
        yield
    finally:
        _write(descriptor, {})  # a clean end leaves no holder behind
        os.close(descriptor)  # releases the flock


def release_lock(folder: Path) -> bool:
    """Clear the holder a stopped run left in ``folder``'s lock file, as its clean end would
    have; True if it was free to clear (no living process holds it), False otherwise."""
    path = folder / LOCK_FILE
    if not path.is_file():
        return True
    descriptor = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        _write(descriptor, {})
        return True
    finally:
        os.close(descriptor)  # releases the flock


def check_folder_free(folder: Path, key: str = "output-dir") -> None:
    """Fail now, naming the holder, if another run holds ``folder`` (checked, not kept)."""
    os.close(_lock(usable_folder(folder, key), key))


def _lock(folder: Path, key: str) -> int:
    path = folder / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"config key '{key}': cannot create {path}: {exc}") from exc
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(descriptor)
        os.close(descriptor)
        raise FolderInUse(
            f"config key '{key}': {folder} is in use by {_describe(holder)}; wait for that run "
            f"to end, stop it, or choose another '{key}'"
        ) from None
    return descriptor


def _holder() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(redacted(sys.argv))[:300],
    }


SECRET_FLAGS = ("token", "secret", "password")  # a flag naming one has its value hidden


def redacted(argv: list[str]) -> list[str]:
    """``argv`` with the values of secret-bearing flags hidden: the lock file and the
    "stale lock" warning show a holder's command, and Flower starts its apps with
    ``--token <run token>``."""
    out, hide = [], False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        secret = flag.startswith("-") and any(word in flag.lower() for word in SECRET_FLAGS)
        if hide:
            out.append("***")
        elif secret and eq:
            out.append(f"{flag}=***")
        else:
            out.append(arg)
        hide = secret and not eq
    return out


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process"
    return (
        f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')} "
        f"({holder.get('command')})"
    )


def _read(descriptor: int) -> dict[str, Any]:
    os.lseek(descriptor, 0, os.SEEK_SET)
    text = os.read(descriptor, 4096).decode(errors="replace")
    try:
        holder = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {"command": f"unreadable lock contents {text[:80]!r}"}
    return holder if isinstance(holder, dict) else {}


def _write(descriptor: int, holder: dict[str, Any]) -> None:
    os.ftruncate(descriptor, 0)
    os.lseek(descriptor, 0, os.SEEK_SET)
    os.write(descriptor, json.dumps(holder).encode() if holder else b"")
