"""The faults the soak injects, and how each finds its target on a loopback deployment.

Every target is a process this soak started, or one started inside a process group it
created (an executor's ``flwr-clientapp``, the node's warm worker, the ``flwr-serverapp``):
they are found by process group in ``/proc``, never by a name across the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUPERNODE = "supernode-kill"
EXECUTOR = "executor-kill"
WORKER = "worker-kill"
SERVER = "server-kill"
PARTITION = "partition"
CLIENT_STATE = "client-state-corrupt"
CHECKPOINT = "checkpoint-corrupt"
STATE_FULL = "state-disk-full"  # a node's state folder fills up, then is freed
OUTPUT_FULL = "output-disk-full"  # the server's output folder fills up: the run stops
NODE_KINDS = (SUPERNODE, EXECUTOR, WORKER, PARTITION, CLIENT_STATE, STATE_FULL)
SERVER_KINDS = (SERVER, CHECKPOINT, OUTPUT_FULL)
KINDS = (*NODE_KINDS, *SERVER_KINDS)
DISK_KINDS = (STATE_FULL, OUTPUT_FULL)  # they need the folders on small disks (a tmpfs: root)
CORRUPT_BYTES = 64  # overwritten in the middle of a file: its size and header stay intact


@dataclass(frozen=True)
class Proc:
    pid: int
    argv: tuple[str, ...]

    def runs(self, name: str) -> bool:
        """Whether ``name`` is the program or a module it runs (``-m client_app.worker``)."""
        return any(Path(a).name == name for a in self.argv[:3])


def in_group(pgid: int) -> Iterator[Proc]:
    """The living processes of process group ``pgid`` (zombies left out)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            yield Proc(int(entry.name), tuple(a.decode(errors="replace") for a in argv if a))


def find(pgid: int, name: str) -> list[Proc]:
    """The processes of group ``pgid`` that run ``name`` (``flwr-clientapp``, ``worker``)."""
    return [p for p in in_group(pgid) if p.runs(name)]


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def newest_round_dir(folder: Path) -> Path | None:
    """The newest ``round-NNNN`` folder under ``folder`` (a node's state or the server's
    checkpoints), None when there is none yet."""
    rounds = sorted(p for p in folder.rglob("round-[0-9][0-9][0-9][0-9]") if p.is_dir())
    return max(rounds, key=lambda p: p.name) if rounds else None


def corrupt(path: Path, seed: int) -> None:
    """Overwrite :data:`CORRUPT_BYTES` in the middle of ``path`` in place, as a failing
    disk would: the file keeps its name, size and (for safetensors) a readable header."""
    size = path.stat().st_size
    start = max(0, size // 2 - CORRUPT_BYTES // 2)
    noise = bytes((seed * 131 + i * 29 + 7) % 256 for i in range(CORRUPT_BYTES))
    with path.open("r+b") as handle:
        handle.seek(start)
        old = handle.read(CORRUPT_BYTES)
        handle.seek(start)
        # XOR with noise that has no zero byte: every byte changes
        handle.write(bytes(a ^ (b | 1) for a, b in zip(old, noise, strict=False)))


def small_disk(folder: Path, size: str) -> str:
    """Mount a fresh tmpfs of ``size`` at ``folder`` (a disk the soak can fill); "" once
    mounted, else why not (this process may not mount: it needs root)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    return done.stderr.strip() or f"mount exited {done.returncode}" if done.returncode else ""


def unmount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path) -> Path:
    """Fill the disk of ``folder`` with one file there; the file (delete it to free)."""
    filler = folder / ".filler"
    with filler.open("ab") as f:
        while True:
            stats = os.statvfs(folder)
            free = stats.f_bavail * stats.f_frsize
            if free <= 0:
                break
            try:
                f.write(bytes(min(free, 1 << 20)))
                f.flush()
            except OSError:
                break
    return filler
