"""A source that trains on several processes: the node's side of such a round.

The node's own process (the ClientApp) stays the source's face to the server. For a source
with ``nproc`` > 1 it hands the round to ``nproc`` worker processes started by PyTorch's
elastic launcher (what ``torchrun --standalone`` runs: a c10d rendezvous on a free loopback
port, no restarts), each running :mod:`dept.train.rank_worker` as one rank
(:mod:`dept.train.ranks`). Everything crosses as files in a per-round folder under the
source's state directory, removed afterwards; tensors only as safetensors, the rest as JSON
(never pickle):

    job.json              the run config, the source, the round: what every rank needs
    arrays.safetensors    θ (and φ, ψ where shared) as the server sent them
    result.json           written by rank 0: the round's statistics and state event
    delta.safetensors     rank 0: the pseudo-gradient
    payload.safetensors   rank 0: what is sent for it, where compression changes it

The ranks read the source's saved state themselves; rank 0 writes the new one, as one
process would, so resuming, re-run rounds and a later change of ``nproc`` all work as for
one process. A rank that fails or dies stops the others (the launcher's doing) and fails
the round with :class:`RankFailed`, naming the source, the rank and the cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from dept.config import ConfigError, DeptConfig, to_run_config
from dept.data.sources import SourceSpec, check_nproc
from dept.state.files import save_tensors
from dept.state.workspace import Attempt, Workspace
from dept.train.local import RoundResult, TrainStats

JOB_FILE, ARRAYS_FILE, RESULT_FILE = "job.json", "arrays.safetensors", "result.json"
DELTA_FILE, PAYLOAD_FILE = "delta.safetensors", "payload.safetensors"
FOLDER_PREFIX = ".ranks-round-"
RANK_MODULE = "dept.train.rank_worker"  # what each rank runs (``python -m``)
# The launcher's own handlers while it runs in the main thread (each raises there, so a
# stopped node stops its ranks); the process's handlers are put back afterwards.
LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# How a rank fails when another one did first, besides being stopped by the launcher: cut
# off in a collective (gloo says so in a RuntimeError). The cause of a round's failure is
# the first rank that failed otherwise.
KNOCK_ON_ERRORS = (
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "Connection closed by peer",
    "Connection reset by peer",
)


class RankFailed(RuntimeError):
    """A process of a multi-process source failed; the message names source, rank, cause."""


@dataclass
class RankJob:
    """What every rank needs to play its part in one round (``job.json``)."""

    run_config: dict[str, Any]  # kebab-case, as :func:`dept.config.load_config` reads it
    spec: dict[str, Any]  # the source, as :class:`SourceSpec` fields
    state_root: str
    run_id: str
    tokenizer_file: str  # the tokenizer the node's process uses (its ids index φ)
    first_gpu: int | None  # rank r trains on GPU first_gpu + r; None: on the CPU
    threads: int  # torch threads per rank
    launcher_pid: int  # a rank whose launcher is gone stops
    global_step: int
    server_round: int
    attempt: dict[str, Any]
    last_trained: int | None
    announce: bool

    def source(self) -> SourceSpec:
        return SourceSpec(**self.spec)

    def workspace(self) -> Workspace:
        return Workspace(Path(self.state_root), self.run_id, self.spec["name"])

    def round_attempt(self) -> Attempt:
        return Attempt(**self.attempt)


class RankResult(NamedTuple):
    """What rank 0 hands back: :class:`dept.train.local.RoundResult`'s fields."""

    delta: dict[str, torch.Tensor]
    payload: dict[str, torch.Tensor]
    stats: TrainStats
    state_event: str
    metrics: dict[str, float]


def first_gpu(spec: SourceSpec, device: torch.device) -> int | None:
    """The GPU rank 0 trains on (the others the next ones), None on the CPU; the node's
    ``device`` names the first (``cuda:1``: GPUs 1 to nproc)."""
    if device.type == "cpu":
        return None
    where = f"source {spec.name!r} key 'nproc' ({spec.nproc})"
    if device.type != "cuda":
        raise ConfigError(f"{where}: several processes train on the CPU or CUDA GPUs, not {device}")
    first, visible = device.index or 0, torch.cuda.device_count()
    if first + spec.nproc > visible:
        raise ConfigError(
            f"{where}: needs GPUs {first} to {first + spec.nproc - 1}, one per process, but "
            f"{visible} are visible here (under dept run or flwr run, client-resources-num-gpus "
            "gives each client its GPUs)"
        )
    return first


def round_job(
    cfg: DeptConfig,
    spec: SourceSpec,
    ws: Workspace,
    tokenizer_file: Path,
    device: torch.device,
    *,
    global_step: int,
    server_round: int,
    attempt: Attempt | None,
    last_trained: int | None,
    announce: bool,
) -> RankJob:
    """The job of one round for ``spec``'s ranks (the round's arguments: ``train_round``'s)."""
    check_nproc(cfg, spec)
    return RankJob(
        run_config=to_run_config(cfg),
        spec=asdict(spec),
        state_root=str(ws.root),
        run_id=ws.dir.relative_to(ws.root / "runs").parts[0],
        tokenizer_file=str(tokenizer_file),
        first_gpu=first_gpu(spec, device),
        threads=max(1, torch.get_num_threads() // spec.nproc),
        launcher_pid=os.getpid(),
        global_step=global_step,
        server_round=server_round,
        attempt=asdict(attempt or Attempt()),
        last_trained=last_trained,
        announce=announce,
    )


def train_on_ranks(job: RankJob, arrays: dict[str, torch.Tensor], ws: Workspace) -> RankResult:
    """Run the round ``job`` on its source's ranks; what rank 0 hands back."""
    folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{job.server_round:04d}-", dir=ws.dir))
    try:
        (folder / JOB_FILE).write_text(json.dumps(asdict(job)))
        save_tensors(arrays, folder / ARRAYS_FILE)
        _launch(job, folder)
        return read_result(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _launch(job: RankJob, folder: Path) -> None:
    name, nproc = job.spec["name"], job.spec["nproc"]
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"{name}-{job.server_round}-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # port 0: the store takes a free one
        max_restarts=0,
        logs_specs=DefaultLogsSpecs(log_dir=str(folder / "logs")),  # error files; no stdio
    )
    # The ranks run this process's copy of dept, wherever the package came from.
    path = os.pathsep.join(filter(None, [_package_root(), os.environ.get("PYTHONPATH")]))
    command = (f"PYTHONPATH={path}", sys.executable, "-m", RANK_MODULE, str(folder))
    try:
        with _handlers_restored():
            elastic_launch(config, shutil.which("env") or "/usr/bin/env")(*command)
    except ChildFailedError as exc:
        rank, cause = failure_cause(exc.failures)
        raise RankFailed(f"source {name!r}: rank {rank} of {nproc} failed: {cause}") from None


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[1])


@contextlib.contextmanager
def _handlers_restored() -> Iterator[None]:
    """The process's signal handlers as they were once the block ends (the launcher sets
    its own for :data:`LAUNCHER_SIGNALS` when it runs in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in LAUNCHER_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)


def failure_cause(failures: dict[int, ProcessFailure]) -> tuple[int, str]:
    """(the rank that failed first of its own accord, why), from the launcher's report:
    a rank stopped by the launcher, or cut off by a peer's death, is a consequence."""

    def knock_on(failure: ProcessFailure) -> bool:
        message = _message(failure)
        return failure.exitcode == -signal.SIGTERM or any(e in message for e in KNOCK_ON_ERRORS)

    rank = min(failures, key=lambda r: (knock_on(failures[r]), failures[r].timestamp, r))
    return rank, _message(failures[rank])


def _message(failure: ProcessFailure) -> str:
    """A failure's reason: the rank's exception, its signal, or its exit code."""
    message = failure.message
    if isinstance(message, dict):  # what @record wrote: {"message": ..., "extraInfo": ...}
        return str(message.get("message", ""))
    if failure.exitcode > 0 and not Path(failure.error_file).is_file():
        return f"exited with code {failure.exitcode} before recording an error"
    return str(message)


def write_result(folder: Path, result: RoundResult) -> None:
    """Rank 0's part: the round's result for the node's process (:func:`read_result`). Of
    the payload only what is not the delta's own tensor is written (all of it under a
    compression; φ's sent rows and their ids)."""
    save_tensors(result.delta, folder / DELTA_FILE)
    own = {n: v for n, v in result.payload.items() if v is not result.delta.get(n)}
    save_tensors(own, folder / PAYLOAD_FILE)
    info = {
        "stats": asdict(result.stats),
        "state_event": result.state_event,
        "metrics": result.metrics,
        "payload": list(result.payload),
    }
    (folder / RESULT_FILE).write_text(json.dumps(info))


def read_result(folder: Path) -> RankResult:
    info = json.loads((folder / RESULT_FILE).read_text())
    delta = load_file(str(folder / DELTA_FILE))
    own = load_file(str(folder / PAYLOAD_FILE))
    payload = {n: own[n] if n in own else delta[n] for n in info["payload"]}
    stats = TrainStats(**info["stats"])
    return RankResult(delta, payload, stats, info["state_event"], info["metrics"])


def read_job(folder: Path) -> tuple[RankJob, dict[str, torch.Tensor]]:
    """A rank's part: the job and the arrays :func:`train_on_ranks` wrote."""
    job = RankJob(**json.loads((folder / JOB_FILE).read_text()))
    return job, load_file(str(folder / ARRAYS_FILE))
