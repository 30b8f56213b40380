"""``dept run --federation processes``: a SuperLink and a SuperNode process per source, no
Ray. How nodes are planned (threads, GPUs, memory bounds), the launchers that stand in for
Flower's commands, and a real run on this machine in which a node is killed and comes
back, a new source joins, and Ctrl-C stops every process."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from client_app.fork_server import FOLDER_VARIABLE
from client_app.node import node_setup
from client_app.warm import worker_folder
from dept.config import ConfigError, DeptConfig, load_config
from dept.data.sources import SourceSpec, run_sources
from server_app.flower_commands import COMMANDS, HEARTBEAT_S, command_folder, with_commands
from server_app.launch import federation_kind, processes_command
from server_app.local_runtime import free_port, processes_with, stop_processes
from server_app.process_federation import PROFILE, plan_nodes

PROJECT = Path(__file__).resolve().parents[2]


def _sources(*names: str) -> list[SourceSpec]:
    return [SourceSpec(name=n, path=f"builtin:synthetic-{n}") for n in names]


def test_nodes_share_the_cores_and_serve_the_sources_as_the_simulation_does(
    tmp_path: Path,
) -> None:
    plans = plan_nodes(_sources("a", "b", "c"), 2, gpus=0, cores=5, root=tmp_path)

    assert [p.sources for p in plans] == [("a", "c"), ("b",)]
    assert [p.env["OMP_NUM_THREADS"] for p in plans] == ["2", "2"]
    assert plans[1].env["DEPT_CLIENTAPP_FORKS"] == str(tmp_path / "forks" / "1")
    assert plans[0].placement == "2 CPU threads"
    assert plans[1].name == "node 1 (b)"
    assert "partition-id=1 num-partitions=2" in plans[1].node_config
    assert f'warm-worker-dir="{tmp_path / "workers" / "1"}"' in plans[1].node_config


def test_nodes_take_the_gpus_round_robin_each_bounded_where_they_share_one(
    tmp_path: Path,
) -> None:
    plans = plan_nodes(_sources("a", "b", "c"), 3, gpus=2, cores=16, root=tmp_path)

    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["0", "1", "0"]
    assert plans[0].placement == "GPU 0 (shared by 2, at most 50% of its memory)"
    assert plans[1].placement == "GPU 1"  # alone on it: no bound
    assert "gpu-memory-fraction=0.5" in plans[2].node_config.split()
    assert "gpu-memory-fraction" not in plans[1].node_config


def test_a_source_on_two_processes_gets_two_gpus(tmp_path: Path) -> None:
    sources = [SourceSpec(name="wide", path="builtin:synthetic-latin", nproc=2), *_sources("b")]
    plans = plan_nodes(sources, 2, gpus=2, cores=16, root=tmp_path)

    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["0,1", "0"]
    assert plans[0].placement == "GPU 0, 1 (shared by 2, at most 50% of its memory)"


def test_a_node_reads_its_worker_folder_and_gpu_bound_from_its_node_config(
    tmp_path: Path,
) -> None:
    cfg = load_config({})
    node = {"partition-id": 0, "num-partitions": 4, "gpu-memory-fraction": 0.25}
    node["warm-worker-dir"] = str(tmp_path / "w0")

    assert worker_folder(node, {}) == tmp_path / "w0"
    assert node_setup(cfg, node, cfg_first_source(cfg)).gpu_memory_fraction == 0.25
    with pytest.raises(ConfigError, match=r"'gpu-memory-fraction' is 1\.5: must be in"):
        node_setup(cfg, {**node, "gpu-memory-fraction": 1.5}, cfg_first_source(cfg))


def cfg_first_source(cfg: DeptConfig) -> str:
    return run_sources(cfg)[0].name


@pytest.mark.slow  # starts Flower's commands (2 s)
def test_the_launchers_run_flowers_commands_on_this_interpreter_with_nothing_on_path(
    tmp_path: Path,
) -> None:
    folder = command_folder(tmp_path / "bin")
    env = with_commands({"PATH": "/nonexistent", "HOME": str(tmp_path)}, folder)

    assert sorted(p.name for p in folder.iterdir()) == sorted(COMMANDS)
    assert (folder / "flwr-clientapp").read_text().startswith(f"#!{sys.executable}\n")
    shown = subprocess.run(
        ["flower-superexec", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "--runtime-api-address" in shown.stdout


@pytest.mark.slow  # starts a fork server and two ClientApps (3 s)
def test_a_nodes_clientapps_are_forked_by_one_server_and_exit_with_flowers_code(
    tmp_path: Path,
) -> None:
    folder = command_folder(tmp_path / "bin")
    env = with_commands({**os.environ, FOLDER_VARIABLE: str(tmp_path / "forks")}, folder)

    output = tmp_path / "node.log"  # the children write where the server does: the node's log

    def clientapp(*args: str) -> int:
        with output.open("a") as log:
            return subprocess.run(
                ["flwr-clientapp", *args], env=env, stdout=log, stderr=log, timeout=60
            ).returncode

    try:
        shown = clientapp("--help")
        servers = _fork_servers(tmp_path / "forks")
        refused = clientapp("--no-such-option")
        assert _fork_servers(tmp_path / "forks") == servers  # the same server, still there
    finally:
        for pid in _fork_servers(tmp_path / "forks"):
            os.kill(pid, signal.SIGKILL)
    assert shown == 0, output.read_text()
    assert len(servers) == 1
    assert "--runtime-api-address" in output.read_text()
    assert refused == 2  # argparse's code, passed on by the launcher
    assert "flwr-clientapp: error: " in output.read_text()


def _fork_servers(folder: Path) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "client_app.fork_server" in (p.info["cmdline"] or [])
        and str(folder) in p.info["cmdline"]
    ]


def test_the_supernode_internals_tuned_for_loopback_are_still_flowers() -> None:
    # an upgrade of Flower that moves them would make the tuning a silent no-op
    from flwr.common.constant import HEARTBEAT_MIN_INTERVAL
    from flwr.supercore import heartbeat
    from flwr.supernode import fleet_http_connection, start_client_internal

    assert "time.sleep(3)" in inspect.getsource(start_client_internal)
    assert heartbeat.HEARTBEAT_DEFAULT_INTERVAL == 30
    assert fleet_http_connection.HEARTBEAT_DEFAULT_INTERVAL == 30
    assert HEARTBEAT_MIN_INTERVAL <= HEARTBEAT_S


def test_auto_runs_processes_where_gpus_are_shared_and_ray_where_it_is_installed() -> None:
    assert federation_kind("auto", gpus=1) == "processes"
    assert federation_kind("auto", gpus=0) == "ray"  # this machine has Ray (flwr[simulation])
    assert federation_kind("processes", gpus=0) == "processes"
    assert federation_kind("ray", gpus=4) == "ray"


def test_flwr_run_submits_to_the_federations_own_profile(tmp_path: Path) -> None:
    command = processes_command(tmp_path, {"model": "debug", "num-server-rounds": 2})

    assert command[:4] == ["flwr", "run", str(tmp_path), PROFILE]
    assert command[-3:] == ["--run-config", 'model="debug" num-server-rounds=2', "--stream"]


# --- a real run --------------------------------------------------------------------------

ROUNDS = 4
SETTINGS = (
    f"model='debug' num-server-rounds={ROUNDS} local-steps=4 warmup-steps=1 seq-len=32 "
    "batch-size=4 eval-bytes=2048"
)
KILLED = 1  # the node killed after round 1
JOINER = "joiner"


@pytest.fixture
def leftovers(tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts itself; they and anything of the run are stopped after."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    stop_processes(lambda: list(_of_run(tmp_path / "run")), 1.0, 10.0)


def _of_run(out: Path) -> Iterator[psutil.Process]:
    """The run's processes: every one carries its Flower home."""
    return processes_with("FLWR_HOME", str(out / ".flwr"))


def _node(out: Path, index: int) -> psutil.Process:
    """The SuperNode process serving partition ``index`` of the run writing ``out``."""
    for process in _of_run(out):
        with_partition = f"partition-id={index} "
        if "flower-supernode" in " ".join(process.cmdline()) and with_partition in " ".join(
            process.cmdline()
        ):
            return process
    raise AssertionError(f"no SuperNode of partition {index} runs")


def _wait(condition: object, what: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert process.poll() is None, f"dept run ended while waiting for {what}"
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.3)


def _round_line(out: Path, server_round: int) -> dict:
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    found = [json.loads(line) for line in lines if json.loads(line)["round"] == server_round]
    return found[0] if found else {}


@pytest.mark.slow
def test_a_federation_of_processes_survives_a_killed_node_takes_a_joiner_and_stops_on_ctrl_c(
    tmp_path: Path, leftovers: list[subprocess.Popen]
) -> None:
    out, state = tmp_path / "run", tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    run = subprocess.Popen(
        [
            *(sys.executable, "-m", "dept_cli", "run", "--federation", "processes"),
            *("--no-stream", "-c", f"{SETTINGS} output-dir='{out}' state-dir='{state}'"),
        ],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    leftovers.append(run)
    assert run.stdout is not None
    first = run.stdout.readline()
    assert "4 SuperNode processes (no Ray)" in first, first
    address = re.search(r"SuperLink on (127\.0\.0\.1:\d+)", first)
    assert address, first

    # a node dies after round 1: SIGKILL to its session (the SuperNode, its executor, its
    # ClientApps); a new source joins through the run's SuperLink, and so does a node whose
    # data is missing
    _wait(lambda: _round_line(out, 1), "round 1", run)
    os.killpg(_node(out, KILLED).pid, signal.SIGKILL)
    missing = tmp_path / "missing"
    for name, path in ((JOINER, "builtin:synthetic-latin"), ("broken", str(missing))):
        joiner = subprocess.Popen(
            [
                *("flower-supernode", "--insecure", "--superlink", address.group(1)),
                *("--port", str(free_port()), "--node-config"),
                f"source='{name}' path='{path}' vocab-size=300",
            ],
            cwd=tmp_path,
            env=with_commands(env, out / ".flwr" / "processes" / "bin"),
            stdout=(tmp_path / f"{name}.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        leftovers.append(joiner)

    # Ctrl-C once the joiner and the killed node's source have both trained
    killed_source = run_sources(load_config({}))[KILLED].name  # the node's one source

    def both_trained() -> bool:
        last = _round_line(out, 3)
        return bool(last) and all(
            last["sources"].get(s, {}).get("tokens") for s in (JOINER, killed_source)
        )

    _wait(both_trained, "round 3 with the joiner and the restarted node", run)
    run.send_signal(signal.SIGINT)
    stdout, err = run.communicate(timeout=60)

    assert run.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("dept run: stopped by SIGINT; resume after")
    assert list(_of_run(out)) == [], "a process of the stopped run is alive"
    log = stdout + (out / "run.log").read_text()
    assert re.search(rf"node {KILLED} \({killed_source}\) exited with code -9; restarted", log)
    broken = re.search(r"[^\n]*cannot take part[^\n]*", log)
    assert broken and "broken" in broken.group(0) and str(missing) in broken.group(0), log[-3000:]
    events = [e for r in range(ROUNDS) for e in _round_line(out, r).get("state_events", [])]
    assert [e for e in events if killed_source in json.dumps(e)] == [], events
    others = [s.name for s in run_sources(load_config({})) if s.name != killed_source]
    for server_round in (2, 3):  # the others trained on without it
        trained = _round_line(out, server_round)["sources"]
        assert all(trained[s]["tokens"] for s in others), trained
