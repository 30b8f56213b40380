"""A node's warm worker: one long-lived process that does the ClientApp's work.

Flower 1.42 runs every deployment message in a fresh ``flwr-clientapp`` process, which
would import torch, transformers and datasets and rebuild the source (model, tokenizer,
token shards) each time. This process does that once and then serves message after
message over a Unix socket (:mod:`client_app.channel`, :mod:`client_app.warm`); its
:func:`client_app.tasks._set_up` cache is keyed by run, source, run config and node
config, so a new run or config builds anew. A source's round state (φ_k, its optimizer, its
stream position) is written behind the reply and kept in memory for the next round
(:mod:`dept.state.write_behind`), whose call waits for the files before it reads it. Killing
the worker once a state is written loses nothing; killing it in the moments between a train
reply and the end of that write costs the source that round's state (it says so). A
source with ``nproc`` > 1 launches its ranks from here (:mod:`dept.train.distributed`), on
its main thread, one task at a time.

Started by the first message (``warm-worker=true``, the default in deployment), or by the
operator beside the SuperNode::

    python -m client_app.worker <state-dir>/warm-worker --watch-pid <SuperNode's pid>

It exits when the process it watches is gone, after ``--idle-s`` without a call, or on
SIGTERM; a second one for the same folder exits at once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from flwr.common.logger import FLOWER_LOGGER

from client_app import channel
from client_app.node_sockets import file_lock, private_folder, socket_address, watch
from client_app.tasks import Task, run_task
from client_app.warm import DEFAULT_IDLE_S, LIFE_LOCK, SOCKET, code_digest, node_token
from dept.logs import drop_misleading_notices, route_to
from dept.state.workspace import Workspace

log = logging.getLogger("client_app.worker")  # run as __main__: name it, or route_to misses it
REQUEST_S = 60.0  # a caller that connects must send its request within this
BACKLOG = 16


class Stop(Exception):
    """SIGTERM: leave the serving loop and clean up."""


def main(argv: list[str] | None = None) -> int:
    args = _arguments().parse_args(argv)
    route_to(FLOWER_LOGGER.name)
    drop_misleading_notices(FLOWER_LOGGER.name)
    folder = private_folder(Path(args.folder))
    Workspace.write_behind = True  # this process lives across rounds (module docstring)
    with file_lock(folder / LIFE_LOCK, blocking=False) as mine:
        if not mine:
            log.info("warm worker: another one serves %s", folder)
            return 0
        signal.signal(signal.SIGTERM, _stop)
        with _listening(folder) as listener, contextlib.suppress(Stop):
            log.info("warm worker %d: serving %s", os.getpid(), folder)
            Worker(node_token(folder), code_digest()).serve(listener, args.watch_pid, args.idle_s)
    return 0


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m client_app.worker", description=__doc__)
    parser.add_argument("folder", help="the node's <state-dir>/warm-worker folder")
    parser.add_argument("--watch-pid", type=int, help="exit when this process is gone")
    parser.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S, help="exit when unused")
    return parser


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signum)


@contextlib.contextmanager
def _listening(folder: Path) -> Iterator[socket.socket]:
    """The socket, bound once a dead worker's is removed (the life lock says none lives)."""
    with contextlib.suppress(FileNotFoundError):
        (folder / SOCKET).unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_address(folder, SOCKET) as address:
            listener.bind(address)
        os.chmod(folder / SOCKET, 0o600)
        listener.listen(BACKLOG)
        yield listener
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            (folder / SOCKET).unlink()  # before the life lock goes: no one dials a corpse


class Worker:
    """Serves one call at a time for as long as it is wanted."""

    def __init__(self, token: str, code: str) -> None:
        self.token, self.code = token, code

    def serve(self, listener: socket.socket, watch_pid: int | None, idle_s: float) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ, "call")
            watched = _watch(watch_pid)
            if watched is not None:
                selector.register(watched, selectors.EVENT_READ, "gone")
            last = time.monotonic()
            while True:
                events = selector.select(timeout=max(0.0, last + idle_s - time.monotonic()))
                if not events:
                    log.info("warm worker: unused for %.0f s, exiting", idle_s)
                    return
                if any(key.data == "gone" for key, _ in events):
                    log.info("warm worker: process %s is gone, exiting", watch_pid)
                    return
                conn, _ = listener.accept()
                with conn:
                    if not self.answer(conn):
                        return
                last = time.monotonic()

    def answer(self, conn: socket.socket) -> bool:
        """Serve one call on ``conn``; whether to go on serving."""
        try:
            request, body = channel.receive_within(conn, REQUEST_S)
            reply, blobs, go_on = self.handle(request, body)
            channel.send(conn, reply, blobs)
        except (channel.ChannelError, OSError) as exc:  # the caller went away
            log.warning("warm worker: a call broke off: %s", exc)
            return True
        return go_on

    def handle(self, request: dict[str, Any], body: list[bytes]) -> tuple[dict, list[bytes], bool]:
        """(the reply header, its arrays, whether to go on serving) for one request."""
        if not channel.same_token(request.get("token"), self.token):
            log.warning("warm worker: refused a call without the node's token")
            return {"error": "PermissionError: wrong or missing node token"}, [], True
        if request.get("code") != self.code:
            log.info("warm worker: the app's code changed, retiring")
            return {"retired": True}, [], False
        try:
            task = Task(
                kind=str(request["kind"]),
                content=channel.decode(request["content"], body),
                run_config=request["run_config"],
                node_config=request["node_config"],
                announce=bool(request["announce"]),
            )
            header, blobs = channel.encode(run_task(task))
        except Exception as exc:  # the caller turns it into the message's error reply
            log.exception("warm worker: %s failed", request.get("kind"))
            return {"error": f"{type(exc).__name__}: {exc}"}, [], True
        return {"content": header}, blobs, True


def _watch(pid: int | None) -> int | None:
    """A pidfd that turns readable when ``pid`` exits (Linux 5.3+); exits now if it has."""
    if pid is None:
        return None
    watched = watch(pid)
    if watched is None:
        log.info("warm worker: process %d is already gone, exiting", pid)
        sys.exit(0)
    return watched


if __name__ == "__main__":
    sys.exit(main())
