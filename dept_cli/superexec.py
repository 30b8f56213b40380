"""``dept superexec``: a node's ``flower-superexec`` whose ClientApp processes start warm.

Flower 1.42's executor starts a ``flwr-clientapp`` process for every message, and each
imports Flower before it reads its message: in the fault soak's loopback deployment a
message was in hand 3.6 s after its process started (median of 73), against 0.1 s of
training; 1.5 s through this command. This runs ``flower-superexec`` with the arguments it
is given, this interpreter's Flower launchers first on ``PATH``
(:mod:`server_app.flower_commands`) and a fork-server folder of its own
(:mod:`client_app.fork_server`): each ClientApp process is forked from one that imported
Flower once and runs Flower's own ``flwr-clientapp`` with the same arguments. An executor
of ServerApps runs as ``flower-superexec`` would.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import psutil

from client_app.fork_server import FOLDER_VARIABLE, remove
from dept.paths import default_state_root
from server_app.flower_commands import command_folder, with_commands

ABOUT = """\
usage: dept superexec [flower-superexec's arguments]

A SuperNode's executor: flower-superexec, its ClientApp processes forked from one that
has Flower imported already (a message is in hand in a fraction of a second, not after
seconds of imports). Every argument is flower-superexec's; its own help follows.

examples:
  dept superexec --insecure --runtime-api-address 127.0.0.1:9094 \\
    --superexec-auth-secret-file superexec.secret   # the node's own Runtime API
"""


def launcher_folder() -> Path:
    """This interpreter's Flower launchers, in the node's cache (one folder per Python)."""
    digest = hashlib.sha256(sys.executable.encode()).hexdigest()[:12]
    return default_state_root() / "commands" / digest


def fork_folder(pid: int) -> Path:
    """The fork server's folder of the executor ``pid``: private, and removed with it."""
    return Path(tempfile.gettempdir()) / f"dept-forks-{os.getuid()}" / str(pid)


def clear_dead(base: Path) -> None:
    """The folders in ``base`` of executors that were killed (their server had no time
    to remove its own)."""
    for folder in base.iterdir() if base.is_dir() else []:
        if folder.name.isdigit() and not psutil.pid_exists(int(folder.name)):
            remove(folder)


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):  # Flower's help, in this process: nothing written
        from flwr.supercore.cli import flower_superexec

        print(ABOUT, flush=True)
        sys.argv = ["flower-superexec", *argv]
        flower_superexec()
    commands = command_folder(launcher_folder())
    executor = [str(commands / "flower-superexec"), *argv]
    forks = fork_folder(os.getpid())  # exec keeps the process id: the executor's
    clear_dead(forks.parent)
    env = {**with_commands(os.environ, commands), FOLDER_VARIABLE: str(forks)}
    os.execve(executor[0], executor, env)
