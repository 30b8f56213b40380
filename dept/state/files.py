"""Tensor files with the mode every other output file gets.

safetensors (0.8) writes a file under a temporary name it creates 0600 and renames into
place, so a ``.safetensors`` file came out owner-only while the JSON and CSV beside it
follow the umask (0644 under the usual 022). :func:`save_tensors` gives it the mode a new
file gets in its folder, so a run's outputs (or a node's state) are all alike and the umask
still decides. Secrets are another matter: :mod:`dept.certificates` writes them 0600.
:func:`replace_dir` puts a finished folder where the old one was, never leaving none.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # dept run's checks use this module's file helpers without torch (a second)
    import torch


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``tensors`` (moved to the CPU, made contiguous) as a safetensors file at ``path``,
    written atomically (safetensors' own rename) with the mode of :func:`new_file_mode`."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
    path.chmod(new_file_mode(path.parent))


def new_file_mode(folder: Path) -> int:
    """The permission bits a file created in ``folder`` gets: 0666 less the umask (or as
    the folder's default ACL says). Found by creating one, since the umask cannot be read
    without setting it, which would race with the files other threads create meanwhile."""
    probe = folder / f".mode-probe-{os.getpid()}-{threading.get_ident()}"
    probe.unlink(missing_ok=True)  # left by a process killed here that had this pid
    descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return stat.S_IMODE(os.fstat(descriptor).st_mode)
    finally:
        os.close(descriptor)
        probe.unlink()


def file_sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, read in chunks by hashlib (a file may be GBs)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the finished folder ``tmp`` at ``final``; at every instant one complete version
    exists (the old one is renamed aside before the new one is renamed in)."""
    old = final.with_name(f".old-{final.name}")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.replace(old)
    tmp.replace(final)
    shutil.rmtree(old, ignore_errors=True)


# a round's folder written under a temporary name, or its old version renamed aside
# (replace_dir): ".tmp-round-0007", ".old-round-0007"
ROUND_IN_WRITING = re.compile(r"\.(?:tmp|old)-round-(\d+)")


def remove_abandoned_writes(folder: Path, written: int) -> None:
    """Remove the folders a writer killed mid-write left in ``folder`` for rounds before
    ``written``, the round just written: its rounds are written in order by one process
    at a time, so no live writer holds one (a killed worker's state, a killed server's
    checkpoint; each can be as large as the model)."""
    for path in folder.glob(".*-round-*"):
        found = ROUND_IN_WRITING.fullmatch(path.name)
        if found and int(found.group(1)) < written:
            shutil.rmtree(path, ignore_errors=True)
