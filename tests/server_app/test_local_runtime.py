"""Each run's own ports and Flower home, and a stop that finds every process of the run,
even those that left its process tree, and no one else's."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dept.config import ConfigError
from server_app.local_runtime import (
    HTTP_PORT_VARIABLE,
    TOKEN_VARIABLE,
    LocalRuntime,
    Stopped,
    processes_with,
    stop_signals,
)

# A parent that starts a grandchild in a session of its own and exits at once: the
# grandchild is reparented, as flwr-simulation and Ray's processes are.
DETACHING_PARENT = (
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
    "start_new_session=True); print(p.pid, flush=True)"
)
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
# A process that blanks the first N entries of its environment block (all of them for 0),
# as setproctitle does when it writes a long title over it (Ray's agents).
RETITLED = """
import ctypes, sys, time
env = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
count = int(sys.argv[1])
i = 0
while env[i] and (i < count or not count):
    ctypes.memset(env[i], 0, len(ctypes.string_at(env[i])))
    i += 1
print("retitled", flush=True)
time.sleep(120)
"""


def test_two_runs_get_their_own_ports_home_and_token(tmp_path: Path) -> None:
    one = LocalRuntime.for_run(tmp_path / "one", {})
    two = LocalRuntime.for_run(tmp_path / "two", {})
    assert one.http_port != two.http_port and one.token != two.token
    env = one.env({"PATH": "/bin"})
    assert env["FLWR_HOME"] == str(tmp_path / "one")
    assert env[HTTP_PORT_VARIABLE] == str(one.http_port) and env[TOKEN_VARIABLE] == one.token
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"


def test_the_users_flower_variables_are_honoured(tmp_path: Path) -> None:
    environ = {"FLWR_HOME": str(tmp_path / "mine"), HTTP_PORT_VARIABLE: "45123"}
    runtime = LocalRuntime.for_run(tmp_path / "default", environ)
    assert runtime.flwr_home == tmp_path / "mine" and runtime.http_port == 45123
    with pytest.raises(ConfigError, match=f"{HTTP_PORT_VARIABLE}='x9' is not a port"):
        LocalRuntime.for_run(tmp_path, {HTTP_PORT_VARIABLE: "x9"})


@pytest.fixture
def answering_port() -> Iterator[int]:
    """A loopback port where something answers ``/health`` as a SuperLink does."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def test_a_superlink_it_did_not_start_is_refused(tmp_path: Path, answering_port: int) -> None:
    with pytest.raises(ConfigError, match=f"already listens on 127.0.0.1:{answering_port}"):
        LocalRuntime.for_run(tmp_path, {HTTP_PORT_VARIABLE: str(answering_port)})


def _spawn(runtime: LocalRuntime, code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], env=runtime.env(dict(os.environ)), stdout=subprocess.PIPE
    )


def test_stop_ends_detached_and_stubborn_processes_and_only_the_runs(tmp_path: Path) -> None:
    runtime = LocalRuntime.for_run(tmp_path, {})
    stranger = LocalRuntime.for_run(tmp_path, {})
    parent = _spawn(runtime, DETACHING_PARENT)
    orphan = psutil.Process(int(parent.stdout.readline()))  # type: ignore[union-attr]
    parent.wait()
    stubborn, other = _spawn(runtime, STUBBORN), _spawn(stranger, STUBBORN)
    try:
        time.sleep(0.5)  # the stubborn one has set its handler
        assert {p.pid for p in runtime.processes()} == {orphan.pid, stubborn.pid}

        started = time.monotonic()
        left = runtime.stop(grace_s=1.0)

        took = time.monotonic() - started
        assert left == [] and 1.0 <= took < 10  # the stubborn one needed SIGKILL
        assert not orphan.is_running() and not psutil.pid_exists(stubborn.pid)
        assert other.poll() is None  # another run's process is not touched
        assert list(processes_with(TOKEN_VARIABLE, runtime.token)) == []
    finally:
        other.kill()
        stranger.stop(grace_s=0.5)


def _retitled_command(blanked: int) -> list[str]:
    return [sys.executable, "-c", RETITLED, str(blanked)]


def _retitled(env: dict[str, str], blanked: int) -> subprocess.Popen:
    """A process whose first ``blanked`` environment entries are NULs, once it said so."""
    process = subprocess.Popen(_retitled_command(blanked), env=env, stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"retitled\n"
    return process


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the environment block is Linux's /proc")
def test_stop_finds_processes_that_wrote_over_their_environment(tmp_path: Path) -> None:
    # Prepare: one lost only its first entry, the other its token too, but its parent has it
    runtime = LocalRuntime.for_run(tmp_path, {})
    env = {"A_TITLE_GOES_HERE": "x" * 40, **runtime.env(dict(os.environ))}
    first = _retitled(env, blanked=1)
    parent = _spawn(runtime, f"import subprocess; subprocess.run({_retitled_command(0)})")
    assert parent.stdout is not None and parent.stdout.readline() == b"retitled\n"
    (lost,) = psutil.Process(parent.pid).children()
    try:
        assert psutil.Process(first.pid).environ() == {}, "psutil's parser sees none of it"
        # Execute
        found = {p.pid for p in runtime.processes()}
        left = runtime.stop(grace_s=0.5)
        # Assert
        assert found == {first.pid, parent.pid, lost.pid} and left == []
        assert not any(psutil.pid_exists(p) for p in found)
    finally:
        for process in (first, parent):
            process.kill()


def test_the_first_signal_stops_and_a_second_does_not_interrupt_the_stopping() -> None:
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs as a background job
    with pytest.raises(Stopped) as stopped, stop_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Stopped:
            os.kill(os.getpid(), signal.SIGINT)  # ignored while the block stops
            time.sleep(0.1)
            raise
    assert stopped.value.name == "SIGTERM" and stopped.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGINT) is before, "the handler from before is back"
