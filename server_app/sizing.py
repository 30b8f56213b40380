"""How ``dept run`` sizes a simulation for this machine: each client's GPU share and CPUs,
how many clients train at once, and whether the server and every client fit.

CPUs matter as much as GPUs. Flower asks 2 CPUs per ClientApp actor unless told otherwise,
and torch takes a thread per CPU it is given: on 2 cores one actor trained the four default
sources one after another on 2 threads, and beside one other busy process those threads
waited on each other (the quickstart's round 1 at about 300 tokens/s against 11,000 on a
quiet machine). Each client gets ``cores // clients`` CPUs instead (at least one), so that
as many clients train at once as the cores hold, each on its own threads
(:mod:`client_app.cpu_share` sets them).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from dept.config import ConfigError, DeptConfig
from dept.data.sources import SourceSpec, check_nproc
from dept.train.budget import (
    Device,
    check_server_fits,
    check_source_fits,
    gb,
    machine_memory,
    server_need,
    shared_vocab_size,
)
from dept.train.device_kind import accelerator_possible, device_kind

RAY_GPU_UNITS = 10_000  # Ray counts GPU fractions in steps of 1e-4


@dataclass(frozen=True)
class ClientShare:
    """What each simulated client asks of Ray, and what that makes of the machine."""

    gpus: float  # client-resources-num-gpus
    cpus: int  # client-resources-num-cpus, and so the client's torch threads
    at_once: int  # clients Ray runs at the same time

    def describe(self) -> str:
        """``2 training at a time, each with 0 GPU and 1 CPU thread``."""
        threads = f"{self.cpus} CPU thread{'' if self.cpus == 1 else 's'}"
        return f"{self.at_once} training at a time, each with {self.gpus:g} GPU and {threads}"


def machine_cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's share)."""
    return len(os.sched_getaffinity(0))


def client_cpus(num_clients: int, cores: int) -> int:
    """CPUs per client: the cores shared equally, at least one (Flower takes whole CPUs)."""
    return max(1, cores // max(1, num_clients))


def client_share(num_clients: int, gpus: float, visible: int, cores: int) -> ClientShare:
    """The share of ``num_clients`` clients each asking ``gpus`` of ``visible`` GPUs on
    ``cores`` cores; Ray runs as many at once as both the CPUs and the GPUs allow."""
    cpus = client_cpus(num_clients, cores)
    at_once = min(num_clients, cores // cpus) if num_clients else 0
    if gpus >= 1:  # whole GPUs (a source on several processes)
        at_once = min(at_once, visible // math.ceil(gpus))
    elif gpus > 0:  # a fraction sits on one GPU
        at_once = min(at_once, visible * (RAY_GPU_UNITS // round(gpus * RAY_GPU_UNITS)))
    return ClientShare(gpus, cpus, at_once)


def visible_gpus(cfg: DeptConfig) -> int:
    """GPUs this run's clients may share: none where the run trains on the CPU."""
    if cfg.device in ("cpu", "mps") or not accelerator_possible():
        return 0
    import torch

    return torch.cuda.device_count()


def gpu_share(num_clients: int, gpus: int) -> float:
    """The GPU fraction per client that Ray can place with every client running at once.

    Ray puts a fractional request on one GPU, never across two, so ``ceil(n / g)`` clients
    share each GPU (a share of ``g / n``, e.g. 0.67 for 3 clients on 2 GPUs, fits once per
    GPU and leaves a client unscheduled). Ray counts GPUs in steps of 1e-4, so the share is
    rounded down to that.
    """
    if gpus == 0 or num_clients == 0:
        return 0.0
    per_gpu = math.ceil(num_clients / gpus)
    return math.floor(RAY_GPU_UNITS / per_gpu) / RAY_GPU_UNITS


def client_gpus(num_clients: int, gpus: int, sources: list[SourceSpec]) -> float:
    """GPUs per simulated client: one per process where a source trains on several
    (``nproc``; Flower asks the same of every client, so the largest sets it, and Ray runs
    as many clients at once as it can give that many GPUs), else :func:`gpu_share`."""
    widest = max(sources, key=lambda s: s.nproc)
    if widest.nproc == 1 or gpus == 0:  # several processes on the CPU need no GPU
        return gpu_share(num_clients, gpus)
    if widest.nproc > gpus:
        raise ConfigError(
            f"source {widest.name!r} key 'nproc' ({widest.nproc}): one GPU per process, but "
            f"{gpus} are visible here"
        )
    return float(widest.nproc)


def check_fits_here(cfg: DeptConfig, sources: list[SourceSpec]) -> None:
    """The server and every client of this simulation fit this machine
    (:mod:`dept.train.budget`)."""
    if cfg.device.startswith("cuda:") and cfg.device != "cuda:0":
        raise ConfigError(
            f"config key 'device' is {cfg.device!r}, but in a simulation Ray gives each client "
            "its GPU share as its only visible GPU (cuda:0): use 'cuda' or 'auto' (cuda:N is "
            "for a SuperNode's node config)"
        )
    check_server_fits(cfg, shared_vocab_size(cfg), machine_memory())
    # a CPU at its peak on every core: the round-time check stays a lower bound
    device = Device.here(device_kind(cfg.device), cpu_threads=machine_cores())
    if device.kind == "cpu":  # one machine's memory holds the server and a training client
        server = server_need(cfg, shared_vocab_size(cfg))
        beside = f"the server's {gb(server)}"
        device = dataclasses.replace(device, memory=device.memory - server, beside=beside)
    for spec in sources:
        check_source_fits(cfg, spec, device)
        check_nproc(cfg, spec)
