"""The ClientApp's side of the node's warm worker: find it, start it if needed, call it.

The worker (:mod:`client_app.worker`) lives in ``<state-dir>/warm-worker/``, a folder only
the node's user may enter (0700), holding its socket, the node's secret token (0600,
checked on every call) and its life lock. A worker that is gone (killed, idle too long,
its SuperNode stopped) leaves at most a dead socket file; the next message finds nobody
listening and starts a fresh one. One that dies mid-call fails that call with a clean
error; nothing is lost, since every round's state is on disk, never only in the worker.

Light on purpose: nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import RecordDict

from client_app import channel
from client_app.node_sockets import dial, file_lock, private_folder
from dept.paths import default_state_root, resolve_path

WARM_KEY = "warm-worker"  # node config: true (default in deployment) or false
IDLE_KEY = "warm-worker-idle-s"  # node config: the worker exits after this long unused
# node config: the worker's folder, for several SuperNodes sharing one state-dir (dept run's
# federation of processes): one worker each, so that they train at the same time
FOLDER_KEY = "warm-worker-dir"
DEFAULT_IDLE_S = 3600.0
FOLDER = "warm-worker"
SOCKET, TOKEN, LIFE_LOCK, START_LOCK = "worker.sock", "token", "worker.lock", "start.lock"
START_S = 300.0  # a loaded machine takes half a minute to import torch alone
DIAL_POLL_S = 0.1
CODE_PACKAGES = ("client_app", "dept")  # what the worker runs: a changed app retires it
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


class WorkerFailed(RuntimeError):
    """The warm worker did not start, or died before it answered."""


def worker_folder(node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> Path:
    """The node's ``warm-worker-dir``, else ``warm-worker/`` in the node's state directory,
    as :func:`client_app.node.node_setup` picks it: the node's ``state-dir``, else the run's,
    else the default."""
    if node_config.get(FOLDER_KEY):
        return resolve_path(str(node_config[FOLDER_KEY]))
    state = node_config.get("state-dir") or run_config.get("state-dir")
    root = resolve_path(str(state)) if state else default_state_root()
    return root / FOLDER


def node_token(folder: Path) -> str:
    """The node's secret, made (0600) by whichever side needs it first."""
    path = folder / TOKEN
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def code_digest() -> str:
    """A digest of the Python code the worker would run (:data:`CODE_PACKAGES`): a worker
    started for another version of the app retires rather than serve it."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((PACKAGE_ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(PACKAGE_ROOT)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass
class WarmWorker:
    """The node's worker as a ClientApp sees it."""

    folder: Path
    idle_s: float = DEFAULT_IDLE_S
    watch_pid: int = field(default_factory=os.getppid)  # the SuperExec: it outlives messages

    @classmethod
    def for_node(cls, node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> WarmWorker:
        idle = float(node_config.get(IDLE_KEY, DEFAULT_IDLE_S))
        return cls(worker_folder(node_config, run_config), idle)

    def call(
        self,
        kind: str,
        content: RecordDict,
        announce: bool,
        run_config: Mapping[str, Any],
        node_config: Mapping[str, Any],
    ) -> RecordDict:
        """The reply content of task ``kind`` on ``content``, as the worker computed it;
        :class:`client_app.channel.RemoteError` where the task failed there."""
        header, blobs = channel.encode(content)
        request = {
            "kind": kind,
            "announce": announce,
            "run_config": dict(run_config),
            "node_config": dict(node_config),
            "content": header,
            "code": code_digest(),
        }
        for _ in range(2):  # a worker of another code version retires; then a fresh one
            reply, body = self._exchange(request, blobs)
            if not reply.get("retired"):
                break
            self._wait_gone()
        if "error" in reply:
            raise channel.RemoteError(str(reply["error"]))
        if "content" not in reply:
            raise WorkerFailed(f"the warm worker in {self.folder} gave no answer: {reply}")
        return channel.decode(reply["content"], body)

    def _exchange(self, request: dict[str, Any], blobs: list[bytes]) -> tuple[dict, list[bytes]]:
        folder = private_folder(self.folder)
        with self._connected(folder) as sock:
            try:
                channel.send(sock, {**request, "token": node_token(folder)}, blobs)
                return channel.receive(sock)
            except (channel.ChannelError, OSError) as exc:
                raise WorkerFailed(
                    f"the node's warm worker ({folder}) stopped mid-call ({exc}); the next "
                    "message starts a fresh one, from the state saved on disk"
                ) from None

    @contextlib.contextmanager
    def _connected(self, folder: Path) -> Iterator[socket.socket]:
        sock = dial(folder, SOCKET)
        if sock is None:
            with file_lock(folder / START_LOCK):  # one ClientApp starts it, the others wait
                sock = dial(folder, SOCKET) or self._start(folder)
        with sock:
            yield sock

    def _start(self, folder: Path) -> socket.socket:
        node_token(folder)
        path = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "client_app.worker", str(folder)]
        command += ["--watch-pid", str(self.watch_pid), "--idle-s", str(self.idle_s)]
        # Its log goes where this process's goes (the SuperExec's output); same session,
        # so whoever stops the SuperExec's process group stops it too.
        process = subprocess.Popen(
            command, env={**os.environ, "PYTHONPATH": path}, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            sock = dial(folder, SOCKET)
            if sock is not None:
                return sock
            if process.poll() is not None:
                raise WorkerFailed(
                    f"the warm worker for {folder} exited with code {process.returncode} "
                    "while starting (its log is above, in the node's)"
                )
            time.sleep(DIAL_POLL_S)
        process.kill()
        raise WorkerFailed(f"the warm worker for {folder} did not listen within {START_S:.0f} s")

    def _wait_gone(self) -> None:
        """Until the retiring worker has let go of its life lock."""
        with file_lock(self.folder / LIFE_LOCK):
            pass
