"""A node's ClientApp processes forked from one that has Flower imported already.

Flower 1.42 runs every message in a new ``flwr-clientapp`` process, and each pays Python's
start and Flower's imports (1.7 s of CPU on an idle core) before it reads the message:
two processes per source and round, and on a machine where the nodes share the cores,
more than the round's training at small and middle sizes. Where ``dept run`` starts the
nodes itself (its federation of processes), and under a deployed node's ``dept superexec``
(:mod:`dept_cli.superexec`), the ``flwr-clientapp`` launcher asks the executor's fork
server instead (:func:`run_forked`, named by :data:`FOLDER_VARIABLE`), which forks a child
with those imports done and runs Flower's own ``flwr_clientapp`` in it, with the same
arguments. The launcher waits for that child and exits with its code, passes on SIGTERM
and SIGINT, and takes the child with it when killed: Flower's executor, and whoever kills
a ClientApp, sees what a plain process would have shown.

The server is started by the first launcher that finds none (in the node's session, so
killing the node kills it), exits when the node's executor is gone, and never imports
this project's packages into what it forks: the child loads the app Flower installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from client_app.node_sockets import dial, file_lock, private_folder, socket_address, watch

FOLDER_VARIABLE = "DEPT_CLIENTAPP_FORKS"  # the node's fork server folder
SOCKET, START_LOCK = "forks.sock", "start.lock"
PROJECT_PACKAGES = ("client_app", "server_app", "dept", "dept_strategy", "dept_cli")
START_S = 60.0
POLL_S = 0.2
FORWARDED = (signal.SIGTERM, signal.SIGINT)


def run_forked(argv: list[str]) -> int:
    """The launcher's side: a child of the node's fork server runs ``flwr-clientapp``
    with ``argv``; its exit code. Without a server that answers, the ClientApp runs here."""
    folder = private_folder(Path(os.environ[FOLDER_VARIABLE]))
    sock = dial(folder, SOCKET)
    if sock is None:
        with file_lock(folder / START_LOCK):
            sock = dial(folder, SOCKET) or _start(folder)
    if sock is None:
        return _in_this_process(argv)
    with sock, sock.makefile("rwb") as stream:
        stream.write(json.dumps({"argv": argv}).encode() + b"\n")
        stream.flush()
        child = int(json.loads(stream.readline())["pid"])
        for each in FORWARDED:
            signal.signal(each, lambda signum, _frame: _pass_on(child, signum))
        answer = stream.readline()
    return int(json.loads(answer)["code"]) if answer else 1


def _pass_on(child: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signum)


def _in_this_process(argv: list[str]) -> int:
    from flwr.supernode.cli import flwr_clientapp

    sys.argv = argv
    flwr_clientapp()
    return 0


def _start(folder: Path) -> socket.socket | None:
    """A fork server for ``folder``, watching the executor that started this launcher."""
    command = [sys.executable, "-m", "client_app.fork_server", str(folder)]
    process = subprocess.Popen([*command, "--watch-pid", str(os.getppid())])
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and process.poll() is None:
        sock = dial(folder, SOCKET)
        if sock is not None:
            return sock
        time.sleep(0.05)
    return None


def serve(folder: Path, watch_pid: int) -> None:
    """Fork a ClientApp per request until ``watch_pid`` (the node's executor) is gone; one
    thread only, so a child never inherits a lock another thread held. A launcher that dies
    first (killed) takes its child with it, as a plain ``flwr-clientapp`` process would go."""
    from flwr.supernode.cli import flwr_clientapp  # what every child would import

    watched = watch(watch_pid)
    if watched is None:
        return
    for each in FORWARDED:  # the node's session stopped: leave no socket behind
        signal.signal(each, lambda _signum, _frame: sys.exit(0))
    try:
        _serve(folder, watched, flwr_clientapp)
    finally:
        remove(folder)


def _serve(folder: Path, watched: int, flwr_clientapp: object) -> None:
    path = folder / SOCKET
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with socket_address(folder, SOCKET) as address:
        server.bind(address)
    server.listen(64)
    waiting: dict[int, socket.socket] = {}  # child pid -> its launcher's connection
    while True:
        launchers = {conn.fileno(): child for child, conn in waiting.items()}
        ready, _, _ = select.select([server.fileno(), watched, *launchers], [], [], POLL_S)
        if watched in ready:  # the executor is gone
            return
        for fileno in set(ready) & set(launchers):  # a launcher never writes: it is gone
            _end(launchers[fileno], waiting)
        if server.fileno() in ready:
            conn, _ = server.accept()
            request = json.loads(conn.makefile("rb").readline() or b"{}")
            if "argv" not in request:
                conn.close()
                continue
            child = os.fork()
            if child == 0:
                server.close()
                conn.close()
                _child(request["argv"], flwr_clientapp)
            conn.sendall(json.dumps({"pid": child}).encode() + b"\n")
            waiting[child] = conn
        _reap(waiting)


def remove(folder: Path) -> None:
    """A fork server's folder and what it holds, and the folder of such folders it was in
    once it holds no other (a folder per executor: ``dept superexec``)."""
    for name in (SOCKET, START_LOCK):
        (folder / name).unlink(missing_ok=True)
    for each in (folder, folder.parent):
        with contextlib.suppress(OSError):
            each.rmdir()


def _end(child: int, waiting: dict[int, socket.socket]) -> None:
    """``child``'s launcher is gone: so is the child, reaped later without a reply."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    waiting.pop(child).close()
    with contextlib.suppress(ChildProcessError):
        os.waitpid(child, 0)


def _child(argv: list[str], flwr_clientapp: object) -> None:
    """In the forked child: Flower's ClientApp with ``argv``, this project's modules
    forgotten (the app Flower installed is loaded instead); never returns."""
    code = 1
    try:
        for each in FORWARDED:
            signal.signal(each, signal.SIG_DFL)
        for name in [m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES]:
            del sys.modules[name]
        sys.argv = argv
        flwr_clientapp()  # type: ignore[operator]
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # reported as the process would have, then the exit
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(waiting: dict[int, socket.socket]) -> None:
    """Send each ended child's exit code to its launcher."""
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError), conn:
                code = os.waitstatus_to_exitcode(status)
                conn.sendall(json.dumps({"code": code}).encode() + b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m client_app.fork_server")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--watch-pid", type=int, required=True)
    args = parser.parse_args()
    serve(args.folder, args.watch_pid)


if __name__ == "__main__":
    main()
