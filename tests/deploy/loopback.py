"""A real Flower deployment on loopback: the processes the Docker images run, as processes.

One SuperLink (``--isolation process``) with its SuperExec, and SuperNodes each with their own
SuperExec, exactly as ``docker/compose.yml`` wires them, optionally behind the nginx gateway of
``docker/gateway.conf.template``; ``flwr run`` against a connection profile in a private
``$FLWR_HOME``. Every process starts in its own session so that it and the app processes its
executor spawns can be killed together; :meth:`Loopback.close` kills whatever is left, even
after a failed test, and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from server_app.flower_commands import command_folder
from server_app.local_runtime import free_port
from tests.deploy import gateway

PROJECT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's flower-* entry points
LOG_POLL_S = 0.5
SERVER_DONE = r"summary written to|validation bits per byte"  # the ServerApp's last lines
RUN_S = 420  # upper bound for one short federation on a loaded 2-core machine


# What a short ``debug`` federation trains, deployed (run_config) or in process (the soak's
# twin and effect sizes): the same numbers either way
DEBUG_TRAINING: dict[str, object] = {
    "model": "debug",
    "seq-len": 32,
    "batch-size": 4,
    "local-steps": 4,
    "warmup-steps": 1,
    "eval-bytes": 2048,
}


def run_config(out: Path, **overrides: object) -> str:
    """``flwr run --run-config`` text for a short ``debug`` federation writing to ``out``."""
    config: dict[str, object] = {
        **DEBUG_TRAINING,
        "num-server-rounds": 3,
        "wait-for-nodes-s": 90.0,
        "round-timeout-s": 120.0,
        "output-dir": str(out),
        **overrides,
    }
    return " ".join(
        f"{k}={json.dumps(v) if isinstance(v, str) else str(v).lower()}" for k, v in config.items()
    )


def node_config(source: str, state: Path, path: str | None = None) -> str:
    """``--node-config`` text for a SuperNode serving ``source`` (built-in synthetic data
    unless ``path``), its round state under ``state``."""
    return (
        f"source='{source}' path='{path or 'builtin:synthetic-' + source}' "
        f"vocab-size=300 state-dir='{state / source}'"
    )


@dataclass
class Tls:
    """Certificates and keys made by ``dept-certs`` (``dept.certificates``)."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def secret(self) -> Path:
        """The SuperExec shared secret (``--superexec-auth-secret-file``)."""
        return self.folder / "superexec.secret"

    def node_key(self, name: str) -> Path:
        return self.folder / "supernodes" / name


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL the process and everything it started (its session), also what it left
        behind when it died first (the group outlives its leader)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, grace_s: float) -> None:
        """SIGTERM its session, then :meth:`kill` what is left after ``grace_s``: a clean
        exit removes what a process owns (a warm worker its socket) before it goes."""
        if grace_s:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace_s)
        self.kill()


@dataclass
class Node:
    source: str
    supernode: Process
    superexec: Process
    runtime_address: str  # the SuperNode's own Runtime API, where its executor takes tasks
    node_config: str = ""

    def kill(self) -> None:
        self.supernode.kill()
        self.superexec.kill()

    def log(self) -> str:
        """The ClientApp's own log lines land in its executor's output."""
        return self.superexec.text()


@dataclass
class Loopback:
    root: Path
    tls: Tls | None = None
    auth: bool = False
    secret: bool = False  # SuperExec authentication on both hops (needs ``tls`` for the file)
    port: int = field(default_factory=free_port)
    gateway_auth: str = field(default_factory=lambda: f"127.0.0.1:{free_port()}")
    processes: list[Process] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # the nodes' executor, as deployed (docs/deployment.md); or Flower's own
    executor: tuple[str, ...] = ("dept", "superexec")
    # the SuperNode ``dept run --federation processes`` starts (a heartbeat every 10 s, a
    # pull every 0.5 s: server_app.flower_commands), not Flower's own (30 s, 3 s): a node
    # lost is found in 20 s, not a minute
    loopback_supernodes: bool = False
    # the SuperLink's state in a database file, as deployed; False: Flower's in-memory store
    database: bool = True

    def __post_init__(self) -> None:
        # A SIGTERM to pytest (a CI job cancelled) unwinds like Ctrl-C, so the fixture's
        # cleanup still kills every process started here.
        signal.signal(signal.SIGTERM, _interrupt)
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)
        self.flwr_home = self.root / "flwr-home"
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.flwr_home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "OMP_NUM_THREADS": "1",  # several trainers share the CI machine's two cores
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(self.root / "tmp"),  # what the processes leave there is the test's
            # torch's compile cache, which importing Transformers' model code creates (under
            # TMPDIR unless this is set, as it is in any process that imported it already)
            "TORCHINDUCTOR_CACHE_DIR": str(self.root / "torch-cache"),
            # the executors start flwr-serverapp and flwr-clientapp by name: this venv's,
            # also when the venv is not activated (``.venv/bin/python -m benchmarks...``)
            "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
        }
        write_profile(self.flwr_home, "loopback", self.address, self.tls)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _security(self) -> list[str]:
        return ["--root-certificates", str(self.tls.ca)] if self.tls else ["--insecure"]

    def _secret(self) -> list[str]:
        if not self.secret:
            return []
        assert self.tls is not None, "the SuperExec secret lives beside the certificates"
        return ["--superexec-auth-secret-file", str(self.tls.secret)]

    def start(self, name: str, *args: str) -> Process:
        """``args[0]``: a venv entry point, or an absolute path (which ``BIN /`` keeps)."""
        log = self.logs / f"{name}.log"
        handle = log.open("w")
        popen = subprocess.Popen(
            [str(BIN / args[0]), *args[1:]],
            cwd=self.root,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def start_superlink(self) -> None:
        args = ["flower-superlink", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--isolation", "process", *self._secret()]
        if self.database:
            args += ["--database", str(self.root / "superlink.db")]
        args += ["--disable-runtime-dependency-installation"]
        if self.tls:
            args += ["--ssl-ca-certfile", str(self.tls.ca)]
            args += ["--ssl-certfile", str(self.tls.folder / "server.pem")]
            args += ["--ssl-keyfile", str(self.tls.folder / "server.key")]
        else:
            args += ["--insecure"]
        if self.auth:
            args += ["--enable-supernode-auth"]
        self.start("superlink", *args)
        self.start(
            "superexec-serverapp",
            "flower-superexec",
            "--runtime-api-address",
            self.address,
            *self._security(),
            *self._secret(),
        )
        wait_for(lambda: self.flwr("supernode", "ls").returncode == 0, 60, "the SuperLink")

    def start_gateway_auth(self) -> Process:
        """``dept gateway-auth`` on the SuperLink's database, at :attr:`gateway_auth`."""
        database = self.root / "superlink.db"
        process = self.start(
            "gateway-auth",
            "dept",
            "gateway-auth",
            "--database",
            str(database),
            "--listen",
            self.gateway_auth,
        )
        wait_for(lambda: accepts(self.gateway_auth), 30, "dept gateway-auth")
        return process

    def start_gateway(self) -> str:
        """The nginx gateway in front of this SuperLink, on every interface as deployed,
        and the verifier it asks; returns the gateway's loopback address."""
        assert self.tls is not None, "the gateway serves TLS"
        self.start_gateway_auth()
        port = free_port()
        folder = self.root / "gateway"
        config = gateway.write_config(
            folder, str(port), self.address, self.tls.folder, self.gateway_auth
        )
        nginx = gateway.nginx()
        assert nginx is not None, "nginx is not installed"
        self.start("gateway", nginx, *gateway.arguments(folder, config))
        wait_for(lambda: accepts(f"127.0.0.1:{port}"), 30, "the gateway")
        return f"127.0.0.1:{port}"

    def start_supernode(
        self,
        source: str,
        node_config: str,
        key: str | None = None,
        via: str | None = None,
        port: int | None = None,
    ) -> tuple[Process, str]:
        """A SuperNode serving ``source``, connecting to ``via`` (default: the SuperLink
        itself), its Runtime API on ``port`` (default: a free one); returns it and the
        address of that Runtime API."""
        port = port or free_port()
        command = "flower-supernode"
        if self.loopback_supernodes:
            command = str(command_folder(self.root / "commands") / command)
        args = [command, "--superlink", via or self.address, "--isolation", "process"]
        args += ["--port", str(port), "--node-config", node_config, *self._security()]
        args += self._secret()
        if key is not None:
            assert self.tls is not None, "node authentication needs TLS"
            args += ["--auth-supernode-private-key", str(self.tls.node_key(key))]
        suffix = sum(p.name.startswith(f"supernode-{source}") for p in self.processes)
        return self.start(f"supernode-{source}-{suffix}", *args), f"127.0.0.1:{port}"

    def add_node(
        self, source: str, node_config: str, key: str | None = None, via: str | None = None
    ) -> Node:
        """A SuperNode serving ``source`` and its executor (the ClientApp runs there)."""
        supernode, runtime = self.start_supernode(source, node_config, key, via)
        superexec = self._start_superexec(supernode.name, runtime)
        return Node(source, supernode, superexec, runtime, node_config)

    def _start_superexec(self, supernode: str, runtime: str) -> Process:
        name = supernode.replace("supernode-", "superexec-", 1)
        if any(p.name == name for p in self.processes):  # a restart keeps the old log
            name += f".{sum(p.name.startswith(name) for p in self.processes)}"
        return self.start(
            name,
            *self.executor,
            "--runtime-api-address",
            runtime,
            "--insecure",  # the node's own Runtime API listens on loopback only
            *self._secret(),
        )

    def restart_supernode(self, node: Node) -> None:
        """A fresh SuperNode (a new node id) in place of ``node``'s, on the same Runtime API
        port, so the executor still running finds it again."""
        port = int(node.runtime_address.rsplit(":", 1)[1])
        node.supernode, _ = self.start_supernode(node.source, node.node_config, port=port)

    def restart_superexec(self, node: Node) -> None:
        """A fresh executor for ``node``'s SuperNode."""
        node.superexec = self._start_superexec(node.supernode.name, node.runtime_address)

    def flwr(
        self, *args: str, home: Path | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """The flwr CLI as the operator, or as whoever owns ``home`` (a ``$FLWR_HOME``)."""
        env = self.env if home is None else {**self.env, "FLWR_HOME": str(home)}
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run(self, run_config: str, name: str = "flwr-run") -> Process:
        """``flwr run`` of this project against the loopback SuperLink, logs streamed (into
        ``logs/<name>.log``: a resubmitted run needs another name to keep the first log)."""
        command = ["flwr", "run", str(PROJECT), "loopback", "--stream"]
        return self.start(name, *command, "--run-config", run_config)

    def close(self, grace_s: float = 0.0) -> None:
        """Stop every process started here, newest first; with ``grace_s`` each gets a
        SIGTERM and that long to exit cleanly before the SIGKILL."""
        for process in reversed(self.processes):
            process.stop(grace_s)

    def logs_tail(self, chars: int = 4000) -> str:
        """The end of every log, for an assertion message."""
        return "\n".join(f"== {p.name}\n{p.text()[-chars:]}" for p in self.processes)


def write_profile(home: Path, name: str, address: str, tls: Tls | None) -> None:
    """A ``$FLWR_HOME`` whose default connection profile ``name`` points at ``address``."""
    home.mkdir(parents=True, exist_ok=True)
    connection = f'address = "{address}"\n'
    connection += f'root-certificates = "{tls.ca}"\n' if tls else "insecure = true\n"
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\n{connection}'
    )


def accepts(address: str) -> bool:
    """Whether something listens at ``host:port`` (a TCP connect, nothing sent)."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return False
    return True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(LOG_POLL_S)


def run_summary(deployment: Loopback, out: Path) -> dict:
    """The summary a finished run wrote to ``out``; the deployment's logs where there is none."""
    summary = out / "summary.json"
    assert summary.exists(), deployment.logs_tail()
    return json.loads(summary.read_text())


def wait_for_line(process: Process, pattern: str, timeout: float) -> re.Match[str]:
    """The first match of ``pattern`` in the process's log, waiting at most ``timeout``;
    fails at once if the process ends without printing it."""
    found: list[re.Match[str]] = []

    def seen() -> bool:
        ended = process.popen.poll() is not None  # read the log after checking
        match = re.search(pattern, process.text())
        if match:
            found.append(match)
        elif ended:
            raise AssertionError(f"{process.name} exited before logging {pattern!r}")
        return bool(match)

    wait_for(seen, timeout, f"{pattern!r} in {process.name}'s log")
    return found[0]
