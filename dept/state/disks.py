"""A full disk, said the same way wherever it stops a write: which folder, how much is free.

Python names the file of an ``ENOSPC`` only where it opened it itself; safetensors' writer
says "I/O error: No space left on device (os error 28)" and a buffered ``write`` no path at
all. So whoever knows which folder it was writing to (a node its state folder, the server
its spool or output folder) adds :func:`disk_note` to the error it reports, and a remote
node's free space reaches the server in the node's own words.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

NO_SPACE = "No space left on device"


def no_space(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, is a full disk."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        if NO_SPACE in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def disk_note(path: Path) -> str:
    """``the disk of FOLDER is full (N free)`` where ``path`` is that folder or a file being
    written in it, on this machine; else ``the disk of PATH is full``."""
    for folder in (path, path.parent):
        if folder.is_dir():
            return f"the disk of {folder} is full ({size(shutil.disk_usage(folder).free)} free)"
    return f"the disk of {path} is full"


def size(count: float) -> str:
    """``12.0 KiB``: a byte count for a person."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"
