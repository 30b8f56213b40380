"""dept run's federation of processes: Flower's deployment runtime on loopback, no Ray.

One SuperLink and one SuperNode per source, each a process of its own on free loopback
ports, the same processes a deployment runs (docs/deployment.md), started with this
interpreter (:mod:`server_app.flower_commands`). Each SuperNode's ClientApps hand their
work to the node's warm worker, which keeps torch, the source and its state resident
between rounds. On a machine with GPUs each node is given one (round-robin over the
visible GPUs, ``CUDA_VISIBLE_DEVICES``); nodes sharing a GPU each get an equal bound on its
memory (node key ``gpu-memory-fraction``), so one that grows cannot starve the others.

:meth:`ProcessFederation.supervise` watches the nodes while the run goes: a node that dies
is started again with the same node config, and its source rejoins from the state it
saved on disk (a new node id; the server's discovery finds it). Every process here
carries the run's token (:mod:`server_app.local_runtime`), so stopping the run stops all
of them, the warm workers included.

The SuperLink listens on loopback without TLS, as the simulation's local SuperLink does:
another user of the same machine could reach it. A federation across machines is a
deployment (TLS, SuperNode keys: docs/deployment.md).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from client_app.fork_server import FOLDER_VARIABLE
from dept.data.sources import SourceSpec
from server_app.config_pairs import pairs_text
from server_app.flower_commands import command_folder, with_commands
from server_app.local_runtime import LocalRuntime, free_port
from server_app.run_log import relay

PROFILE = "dept-processes"  # the connection profile flwr run submits to
RESTART_LIMIT = 5  # restarts per node; after that the run goes on without it
POLL_S = 1.0
# How often each node's executor asks its SuperNode for a ClientApp to start (Flower: 1 s,
# a second of every message's wait)
EXECUTOR_POLL = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.25"}
SUPERLINK_START_S = 60.0


@dataclass(frozen=True)
class NodePlan:
    """One SuperNode: what it serves, its node config and what it is given of the machine."""

    index: int
    sources: tuple[str, ...]
    node_config: str
    env: dict[str, str]
    placement: str  # "GPU 0 (shared by 2, at most 50% of its memory)" or "1 CPU thread"

    @property
    def name(self) -> str:
        return f"node {self.index} ({', '.join(self.sources) or 'no source'})"


def plan_nodes(
    sources: list[SourceSpec], num_nodes: int, gpus: int, cores: int, root: Path
) -> list[NodePlan]:
    """``num_nodes`` SuperNodes over ``sources`` (node ``p`` serves sources ``p, p+P, ...``
    as in the simulation), each with its share of ``cores`` as torch threads and, where
    ``gpus`` are visible, as many of them as its widest source has processes (``nproc``),
    handed out round-robin; nodes that share a GPU each get an equal bound on its memory."""
    served = [sources[index::num_nodes] for index in range(num_nodes)]
    devices, cursor = [], 0
    for node_sources in served:
        width = min(gpus, max((s.nproc for s in node_sources), default=1)) if gpus else 0
        devices.append([(cursor + j) % gpus for j in range(width)])
        cursor += width
    sharing = Counter(gpu for node in devices for gpu in node)
    threads = max(1, cores // max(1, num_nodes))
    plans = []
    for index, (node_sources, node_gpus) in enumerate(zip(served, devices, strict=True)):
        pairs: dict[str, object] = {
            "partition-id": index,
            "num-partitions": num_nodes,
            "warm-worker-dir": str(root / "workers" / str(index)),
        }
        env = {
            "OMP_NUM_THREADS": str(threads),
            # its ClientApp processes forked from one with Flower imported
            FOLDER_VARIABLE: str(root / "forks" / str(index)),
        }
        placement = f"{threads} CPU thread{'' if threads == 1 else 's'}"
        if node_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, node_gpus))
            placement = f"GPU {', '.join(map(str, node_gpus))}"
            shared = max(sharing[gpu] for gpu in node_gpus)
            if shared > 1:
                pairs["gpu-memory-fraction"] = round(1 / shared, 4)
                placement += f" (shared by {shared}, at most {1 / shared:.0%} of its memory)"
        node_config = pairs_text(pairs)
        names = tuple(s.name for s in node_sources)
        plans.append(NodePlan(index, names, node_config, env, placement))
    return plans


def _copy(popen: subprocess.Popen, log: IO[str]) -> None:
    """``popen``'s output into ``log`` until every process that shares it has ended."""
    assert popen.stdout is not None
    with log, popen.stdout:
        relay(popen.stdout, log)


@dataclass
class NodeProcess:
    """A SuperNode started from ``plan``, and how often it was started again."""

    plan: NodePlan
    popen: subprocess.Popen
    restarts: int = 0


@dataclass
class ProcessFederation:
    """The SuperLink and SuperNodes of one run, started in ``root`` (logs in ``root/logs``)."""

    root: Path
    runtime: LocalRuntime
    plans: list[NodePlan]
    env: dict[str, str] = field(default_factory=dict)
    nodes: list[NodeProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "home"  # the flwr CLI's profile for this SuperLink
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{PROFILE}"\n\n[superlink.{PROFILE}]\n'
            f'address = "{self.address}"\ninsecure = true\n'
        )
        self.env = with_commands({**self.env, **EXECUTOR_POLL}, command_folder(self.root / "bin"))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.runtime.http_port}"

    def flwr_env(self) -> dict[str, str]:
        """The environment ``flwr run`` submits with: this federation's profile."""
        return {**self.env, "FLWR_HOME": str(self.home)}

    def start(self) -> None:
        """The SuperLink, once it answers, then every SuperNode (they connect on their own)."""
        port = str(self.runtime.http_port)
        superlink = self._spawn(
            "superlink",
            ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", port],
            {},
        )
        deadline = time.monotonic() + SUPERLINK_START_S
        while not self.runtime.superlink_answers():
            if superlink.poll() is not None or time.monotonic() > deadline:
                tail = (self.logs / "superlink.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the SuperLink on {self.address} did not start:\n{tail}")
            time.sleep(0.2)
        self.nodes = [self._start_node(plan) for plan in self.plans]

    def _start_node(self, plan: NodePlan, restarts: int = 0) -> NodeProcess:
        command = ["flower-supernode", "--insecure", "--superlink", self.address]
        command += ["--port", str(free_port(self.env)), "--node-config", plan.node_config]
        popen = self._spawn(f"node-{plan.index}", command, plan.env, append=restarts > 0)
        return NodeProcess(plan, popen, restarts)

    def _spawn(
        self, name: str, command: list[str], env: dict[str, str], append: bool = False
    ) -> subprocess.Popen:
        """``command`` in a session of its own (a node's kill takes its executor and
        ClientApps with it), its output stamped with the time into ``logs/NAME.log``."""
        popen = subprocess.Popen(
            command,
            env={**self.env, **env},
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            errors="replace",
        )
        log = (self.logs / f"{name}.log").open("a" if append else "w")
        threading.Thread(target=_copy, args=(popen, log), name=f"log-{name}", daemon=True).start()
        return popen

    def restart_dead(self, say: Callable[[str], None]) -> None:
        """Start again every node that has exited (up to :data:`RESTART_LIMIT` times each)."""
        for i, node in enumerate(self.nodes):
            code = node.popen.poll()
            if code is None or node.restarts > RESTART_LIMIT:
                continue
            if node.restarts == RESTART_LIMIT:
                say(
                    f"{node.plan.name} exited with code {code} after {RESTART_LIMIT} restarts; "
                    f"not restarted again (its log: {self.logs}/node-{node.plan.index}.log)"
                )
                node.restarts += 1
                continue
            self.nodes[i] = self._start_node(node.plan, node.restarts + 1)
            say(
                f"{node.plan.name} exited with code {code}; restarted "
                f"({node.restarts + 1} of at most {RESTART_LIMIT}), its sources rejoin from "
                "their saved state"
            )

    @contextlib.contextmanager
    def supervise(self, say: Callable[[str], None]) -> Iterator[None]:
        """While the block runs, a thread restarts nodes that die; it stops before the
        block's end, so the run's own stop is never answered by a restart."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(POLL_S):
                self.restart_dead(say)

        watcher = threading.Thread(target=watch, name="node-supervisor", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def describe(self) -> str:
        """One line per node: what it serves and what it was given."""
        return "\n".join(f"  {p.name}: {p.placement}" for p in self.plans)
