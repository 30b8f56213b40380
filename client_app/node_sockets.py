"""A node's private folders and Unix sockets, shared by its warm worker and its fork server.

Light on purpose: nothing here imports Flower or torch, so a process that only needs to
reach a server of the node (the launcher of every ClientApp process) starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

MAX_SOCKET_PATH = 100  # AF_UNIX paths end at 108 bytes; longer ones go through /proc


def private_folder(folder: Path) -> Path:
    """``folder``, created 0700; refused if another user owns it or may enter it."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"{folder} belongs to another user: not a channel for this node")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)  # ours, made by an older umask: close it
    return folder


@contextlib.contextmanager
def socket_address(folder: Path, name: str) -> Iterator[str]:
    """The address of socket ``name`` in ``folder``; a long path goes through
    ``/proc/self/fd`` (Linux), whose length does not depend on the folder's."""
    path = folder / name
    if len(str(path)) <= MAX_SOCKET_PATH:
        yield str(path)
        return
    fd = os.open(folder, os.O_PATH)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def dial(folder: Path, name: str) -> socket.socket | None:
    """A connection to socket ``name`` in ``folder``; None where nobody listens there (no
    socket, or the one a dead server left)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_address(folder, name) as address:
            sock.connect(address)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def watch(pid: int) -> int | None:
    """A pidfd that turns readable when ``pid`` exits (Linux 5.3+); None if it has already."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


@contextlib.contextmanager
def file_lock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on ``path`` (whether it was got). The kernel drops it when
    its holder dies, so a killed worker never leaves a stale lock."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
