"""``dept superexec``: Flower's executor, its ClientApps forked by a fork server of its own;
a ClientApp whose launcher is killed dies with it, and the executor's folders go with it."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from client_app.fork_server import FOLDER_VARIABLE, SOCKET, START_LOCK
from dept_cli.superexec import clear_dead, fork_folder, launcher_folder
from server_app.flower_commands import command_folder, with_commands
from server_app.local_runtime import free_port
from tests.command_examples import doc_examples, help_examples

SUPEREXEC = "dept_cli.superexec"
# docs/deployment.md's node machine makes the executor's secret so
SECRET_LINE = (
    '(umask 077; python -c "import secrets; print(secrets.token_hex(32))" > superexec.secret)'
)
WAIT_S = 30.0


def _until(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}"
        time.sleep(0.1)


def _server_folder(base: Path, name: str) -> Path:
    folder = base / name
    folder.mkdir(parents=True)
    (folder / SOCKET).touch()
    (folder / START_LOCK).touch()
    return folder


def test_only_the_folders_of_executors_that_are_gone_are_cleared(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    base = tmp_path / "forks"
    alive, dead = _server_folder(base, str(os.getpid())), _server_folder(base, str(gone.pid))
    other = base / "notes"
    other.mkdir()

    clear_dead(base)

    assert (alive / SOCKET).exists(), "a running executor's folder is kept"
    assert not dead.exists()
    assert other.is_dir(), "only folders named by a process id"


@pytest.mark.slow  # starts Flower's executor (2 s)
def test_the_help_example_runs_flowers_executor_with_the_fork_launcher_first_on_path(
    tmp_path: Path,
) -> None:
    (example,) = [c for c, where in help_examples().items() if where.startswith(SUPEREXEC)]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    # the secret beside it, made by the docs' own line
    assert SECRET_LINE in doc_examples()
    subprocess.run(["bash", "-c", SECRET_LINE], env=env, cwd=tmp_path, check=True, timeout=60)
    secret = tmp_path / "superexec.secret"
    assert secret.stat().st_mode & 0o777 == 0o600, "only its owner reads it"
    assert re.fullmatch(r"[0-9a-f]{64}\n", secret.read_text())
    executor = subprocess.Popen(  # as printed: nobody on 9094, so it waits for its SuperNode
        shlex.split(example),
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        process = psutil.Process(executor.pid)
        _until(lambda: "flower-superexec" in " ".join(process.cmdline()), "the exec")
        seen = process.environ()
        cmdline = process.cmdline()
    finally:
        executor.terminate()
        executor.wait(timeout=30)

    launchers = Path(seen["PATH"].split(os.pathsep)[0])
    assert cmdline[2:] == shlex.split(example)[2:], "its arguments, Flower's"
    assert launchers.parent == tmp_path / "cache" / "dept" / "commands"
    assert (launchers / "flwr-clientapp").read_text().startswith(f"#!{sys.executable}\n")
    assert FOLDER_VARIABLE in (launchers / "flwr-clientapp").read_text()
    expected = tmp_path / f"dept-forks-{os.getuid()}" / str(executor.pid)
    assert seen[FOLDER_VARIABLE] == str(expected), "a folder of its own, by its process id"


@pytest.mark.slow  # a fork server and two ClientApps (3 s)
def test_a_clientapp_dies_with_its_launcher_and_the_server_leaves_no_folder(
    tmp_path: Path,
) -> None:
    base = tmp_path / "forks"
    folder = base / "node"
    env = with_commands({**os.environ, FOLDER_VARIABLE: str(folder)}, command_folder(tmp_path))
    # a ClientApp that waits for a SuperNode nobody runs, until it is killed
    waiting = ["flwr-clientapp", "--insecure", "--token", "t"]
    waiting += ["--runtime-api-address", f"127.0.0.1:{free_port()}"]
    launcher = subprocess.Popen(waiting, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        _until(lambda: _forked(folder), "a ClientApp forked by the node's fork server")
        (server,) = _servers(folder)
        (clientapp,) = _forked(folder)

        launcher.kill()
        launcher.wait(timeout=10)

        _until(lambda: not clientapp.is_running() or clientapp.status() == "zombie", "its end")
        assert server.is_running(), "the server goes on for the next message"
        server.send_signal(signal.SIGTERM)  # the node's session stopped
        server.wait(timeout=10)
    finally:
        for left in _servers(folder):
            left.kill()
    assert not base.exists(), "its socket, lock and folders gone"


def _servers(folder: Path) -> list[psutil.Process]:
    """The fork server of ``folder`` (its children, forked, show the same command line)."""
    found = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "client_app.fork_server" in (p.info["cmdline"] or [])
        and str(folder) in p.info["cmdline"]
    ]
    return [p for p in found if p.ppid() not in {q.pid for q in found}]


def _forked(folder: Path) -> list[psutil.Process]:
    return [child for server in _servers(folder) for child in server.children()]


def test_the_launchers_live_in_the_nodes_cache_one_folder_per_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert launcher_folder().parent == tmp_path / "dept" / "commands"
    assert launcher_folder() == launcher_folder()
    assert fork_folder(7).name == "7"
