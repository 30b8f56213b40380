"""The local Flower runtime of one ``dept run``: its own SuperLink, ports and Flower home.

``flwr run`` in the simulation runtime starts a background SuperLink on fixed ports
(39091/39093) the first time it finds none there, and attaches to whatever answers on them
after that: on a shared machine, another user's. So each ``dept run`` picks free loopback
ports (or the user's ``FLWR_LOCAL_*`` ports), a Flower home of its own (or the user's
``FLWR_HOME``), and refuses a SuperLink it did not start.

Everything the run starts (SuperLink, SuperExec, ``flwr-simulation``, Ray's processes and
actors) detaches from ``dept run``'s process tree, some into new sessions, and outlives a
dead parent. What they all keep is the environment they inherit, so every one carries
:data:`TOKEN_VARIABLE` with this run's token, and :meth:`LocalRuntime.stop` ends exactly
the processes that carry it: this run's, nobody else's.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from flwr.cli.constant import DEFAULT_FLOWER_CONFIG_TOML, FLOWER_CONFIG_FILE

from dept.config import ConfigError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
TOKEN_VARIABLE = "DEPT_RUN_TOKEN"
HTTP_PORT_VARIABLE = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
CONTROL_PORT_VARIABLE = "FLWR_LOCAL_CONTROL_API_PORT"
RAY_TIP_FILTER = "ignore::FutureWarning:ray._private.worker"
# Where free ports are looked for: below Linux's default ephemeral ports (32768-60999) and
# above Ray's worker ports (10002-19999). The tests give each of their workers a part.
PORT_SPAN_VARIABLE = "DEPT_PORT_SPAN"
PORT_SPAN = range(20_000, 32_768)
PORT_PROBES = 200
GRACE_S = 10.0  # SIGTERM, then this long, then SIGKILL
STOP_DEADLINE_S = 25.0  # everything gone within this, or reported
PROC = Path("/proc")


@dataclass
class LocalRuntime:
    """The ports, Flower home and token of one run; :meth:`env` is what its children get."""

    flwr_home: Path
    http_port: int
    control_port: int
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def for_run(cls, default_home: Path, environ: dict[str, str]) -> LocalRuntime:
        """Free ports and ``default_home``, unless the user's variables name their own; a
        :class:`ConfigError` when a SuperLink already answers on the chosen port."""
        home = Path(environ["FLWR_HOME"]) if environ.get("FLWR_HOME") else _fresh(default_home)
        runtime = cls(
            flwr_home=home,
            http_port=_port(environ, HTTP_PORT_VARIABLE),
            control_port=_port(environ, CONTROL_PORT_VARIABLE),
        )
        if runtime.superlink_answers():
            raise ConfigError(
                f"a SuperLink not started by this run already listens on 127.0.0.1:"
                f"{runtime.http_port} ({HTTP_PORT_VARIABLE}); unset it to let dept run pick "
                "free ports, or use plain flwr run to run on that SuperLink"
            )
        return runtime

    def env(self, environ: dict[str, str]) -> dict[str, str]:
        """``environ`` for ``flwr run``: this runtime's home, ports and token, no update
        check (offline), no per-run dependency installation (it would fetch a CUDA torch)."""
        return {
            **environ,
            "FLWR_HOME": str(self.flwr_home),
            HTTP_PORT_VARIABLE: str(self.http_port),
            CONTROL_PORT_VARIABLE: str(self.control_port),
            TOKEN_VARIABLE: self.token,
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            # Ray's tip that a future Ray will stop hiding GPUs from num-gpus=0 actors:
            # the advice it gives would change what clients see, so only the tip goes
            "PYTHONWARNINGS": ",".join(
                w for w in (environ.get("PYTHONWARNINGS"), RAY_TIP_FILTER) if w
            ),
        }

    def superlink_answers(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.http_port}/health"
            return httpx.get(url, timeout=1.0).is_success
        except httpx.HTTPError:
            return False

    def processes(self) -> list[psutil.Process]:
        """This run's living processes: those whose environment carries its token, and every
        process they started. A process can write over its own environment: Ray's dashboard
        and runtime-env agents write their title there (setproctitle), the token with it,
        and lived on after the run stopped; their parent, the raylet, keeps it."""
        found: dict[int, psutil.Process] = {}
        for carrier in processes_with(TOKEN_VARIABLE, self.token):
            found[carrier.pid] = carrier
            with contextlib.suppress(psutil.Error):  # ended meanwhile
                found.update((child.pid, child) for child in carrier.children(recursive=True))
        return list(found.values())

    def stop(self, grace_s: float = GRACE_S) -> list[psutil.Process]:
        """SIGTERM every process of this run, SIGKILL what is left after ``grace_s``, and
        look again for any started meanwhile; the processes still alive at the deadline."""
        return stop_processes(self.processes, grace_s, STOP_DEADLINE_S)


@contextlib.contextmanager
def local_runtime(default_home: Path) -> Iterator[LocalRuntime]:
    """A :class:`LocalRuntime` for one ``flwr run`` (from this process's environment),
    stopped with every process of it when the block ends."""
    runtime = LocalRuntime.for_run(default_home, dict(os.environ))
    try:
        yield runtime
    finally:
        runtime.stop()


class Stopped(Exception):
    """SIGINT or SIGTERM arrived: the run is to stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.name = signum, signal.Signals(signum).name


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise :class:`Stopped` in the main thread;
    after the first, both are ignored until the block ends, so stopping is not cut short."""

    def stop(signum: int, _frame: object) -> None:
        for each in STOP_SIGNALS:
            signal.signal(each, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {each: signal.signal(each, stop) for each in STOP_SIGNALS}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


def processes_with(variable: str, value: str) -> Iterator[psutil.Process]:
    """Processes of this user whose environment has ``variable=value`` (others' are not
    readable and are skipped, as are processes that end while being read)."""
    me, entry = os.getpid(), os.fsencode(f"{variable}={value}")
    for process in psutil.process_iter():
        if process.pid != me and entry in environment_entries(process):
            yield process


def environment_entries(process: psutil.Process) -> list[bytes]:
    """Every ``NAME=value`` of ``process``'s environment block; none where it cannot be read.

    On Linux the block is read whole from /proc: a process that wrote its title over the
    block's start (setproctitle, as Ray's agents do) leaves a run of NULs there, where
    psutil's parser stops, and every entry after them would go unseen."""
    try:
        if PROC.is_dir():
            return (PROC / str(process.pid) / "environ").read_bytes().split(b"\0")
        return [os.fsencode(f"{k}={v}") for k, v in process.environ().items()]
    except (OSError, psutil.Error):  # another user's, or ended meanwhile
        return []


def stop_processes(
    find: Callable[[], list[psutil.Process]], grace_s: float, deadline_s: float
) -> list[psutil.Process]:
    """Terminate, wait, kill, until ``find()`` returns nothing or ``deadline_s`` passed."""
    end = time.monotonic() + deadline_s
    alive: list[psutil.Process] = find()
    while alive and time.monotonic() < end:
        for process in alive:
            _signal(process, psutil.Process.terminate)
        _, alive = psutil.wait_procs(alive, timeout=min(grace_s, max(0.0, end - time.monotonic())))
        for process in alive:
            _signal(process, psutil.Process.kill)
        psutil.wait_procs(alive, timeout=2.0)
        alive = find()
    return alive


def _signal(process: psutil.Process, send: Callable[[psutil.Process], None]) -> None:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        send(process)


def _fresh(home: Path) -> Path:
    """``home`` with Flower's default config already in it, so that ``flwr run`` does not
    announce, on every run, that it created one."""
    config = home / FLOWER_CONFIG_FILE
    if not config.exists():
        home.mkdir(parents=True, exist_ok=True)
        config.write_text(DEFAULT_FLOWER_CONFIG_TOML, encoding="utf-8")
    return home


def _port(environ: dict[str, str], variable: str) -> int:
    """The user's port from ``variable``, else a free loopback port."""
    if value := environ.get(variable):
        if not value.isdigit() or not 0 < int(value) < 65536:
            raise ConfigError(f"environment variable {variable}={value!r} is not a port number")
        return int(value)
    return free_port(environ)


def free_port(environ: Mapping[str, str] | None = None) -> int:
    """A loopback port free now, from :data:`PORT_SPAN_VARIABLE`'s span (default
    :data:`PORT_SPAN`). Not the kernel's ``bind(0)``: that hands out ephemeral ports, which
    every outgoing connection also takes, so one could take the port between this probe and
    the server's bind; below that range only another probe could."""
    span = port_span((os.environ if environ is None else environ).get(PORT_SPAN_VARIABLE))
    for port in random.Random().sample(span, min(PORT_PROBES, len(span))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise ConfigError(
        f"no free loopback port among {PORT_PROBES} tried in {span.start}-{span.stop - 1} "
        f"({PORT_SPAN_VARIABLE})"
    )


def port_span(text: str | None) -> range:
    """``LOW-HIGH`` (inclusive) as a range; the default span where ``text`` is empty."""
    if not text:
        return PORT_SPAN
    low, sep, high = text.partition("-")
    if not (sep and low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) < 65536):
        raise ConfigError(
            f"environment variable {PORT_SPAN_VARIABLE}={text!r} is not a port span LOW-HIGH"
        )
    return range(int(low), int(high) + 1)
