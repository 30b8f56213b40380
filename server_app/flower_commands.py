"""Flower's commands for this interpreter, wherever Flower was installed from.

Flower's components start each other by command name: a SuperLink or SuperNode starts
``flower-superexec``, which starts ``flwr-serverapp`` or ``flwr-clientapp`` per task. Those
names exist only where pip installed Flower's entry points on ``PATH``; a machine image
that carries Flower as an unpacked wheel (``PYTHONPATH``), or a venv run without being
activated, has none, or another Python's. :func:`command_folder` writes the same small
launchers pip would, bound to this interpreter, into a folder put first on the run's
``PATH``: the whole federation then runs on the Python that runs ``dept run``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from client_app.fork_server import FOLDER_VARIABLE

# Flower 1.42's console scripts (its entry_points.txt): command -> (module, function); the
# SuperNode's with quicker pulls (supernode_on_loopback)
COMMANDS: dict[str, tuple[str, str]] = {
    "flower-superlink": ("flwr.superlink.cli", "flower_superlink"),
    "flower-supernode": ("server_app.flower_commands", "supernode_on_loopback"),
    "flower-superexec": ("flwr.supercore.cli", "flower_superexec"),
    "flwr": ("flwr.cli.app", "app"),
    "flwr-serverapp": ("flwr.superlink.cli", "flwr_serverapp"),
    "flwr-clientapp": ("flwr.supernode.cli", "flwr_clientapp"),
    "flwr-simulation": ("flwr.simulation.app", "flwr_simulation"),
}
LAUNCHER = """\
#!{python}
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.exit({function}())
"""
# flwr-clientapp: from the node's fork server where the node has one (client_app.fork_server)
CLIENTAPP_LAUNCHER = """\
#!{python}
import os
import sys
if __name__ == "__main__":
    if os.environ.get("{forks}"):
        from client_app.fork_server import run_forked
        sys.exit(run_forked(sys.argv))
    from {module} import {function}
    sys.exit({function}())
"""


PULL_S = 0.5  # at most this long between a SuperNode's pulls (Flower 1.42: 3 s)
HEARTBEAT_S = 10  # a SuperNode's heartbeat interval (Flower 1.42: 30 s; its least: 10 s)


class _QuickerSleeps:
    """The ``time`` module, but a sleep lasts at most :data:`PULL_S`."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def sleep(self, seconds: float) -> None:
        self._real.sleep(min(seconds, PULL_S))


def supernode_on_loopback() -> None:
    """``flower-supernode``, tuned for a SuperLink on the same machine.

    - It asks for a message every :data:`PULL_S`: Flower 1.42's SuperNode sleeps 3 s after
      every pull that found no message, so each message waits 1.5 s on average before its
      node sees it (a round's train and evaluate messages: 3 s of every round, at any model
      size), where a pull is one local HTTP request.
    - Its heartbeat promises :data:`HEARTBEAT_S` (Flower's least; default 30 s): a node
      that died is declared gone, and its message in a round failed, after twice that,
      not after a minute.
    """
    from flwr.supercore import heartbeat
    from flwr.supernode import fleet_http_connection, start_client_internal
    from flwr.supernode.cli import flower_supernode

    start_client_internal.time = _QuickerSleeps(time)  # type: ignore[assignment]
    heartbeat.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT_S
    fleet_http_connection.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT_S
    flower_supernode()


def command_folder(folder: Path) -> Path:
    """``folder`` holding a launcher per Flower command, each running this interpreter
    (the script's own name stays ``argv[0]``, which Flower and the ClientApp read)."""
    folder.mkdir(parents=True, exist_ok=True)
    for command, (module, function) in COMMANDS.items():
        path = folder / command
        template = CLIENTAPP_LAUNCHER if command == "flwr-clientapp" else LAUNCHER
        text = template.format(
            python=sys.executable, module=module, function=function, forks=FOLDER_VARIABLE
        )
        if not path.is_file() or path.read_text() != text:  # whole or not at all: shared
            fresh = folder / f".{command}.{os.getpid()}"
            fresh.write_text(text)
            fresh.chmod(0o755)
            os.replace(fresh, path)
    return folder


def with_commands(environ: Mapping[str, str], folder: Path) -> dict[str, str]:
    """``environ`` with ``folder``'s launchers first on ``PATH``."""
    path = os.pathsep.join(filter(None, [str(folder), environ.get("PATH", "")]))
    return {**environ, "PATH": path}
