"""Which device a node trains on, and why: said once per run, loudly when GPUs sit unused.

Flower's simulation gives a ClientApp actor no GPU unless the federation asks for
``client-resources-num-gpus``; Ray then hides every GPU from it (``CUDA_VISIBLE_DEVICES=""``)
and ``device='auto'`` quietly picks the CPU. Nothing in torch can tell that apart from a
machine without GPUs, so :func:`machine_gpus` counts them from the driver instead.
"""

from __future__ import annotations

import glob
import os

import torch

from dept.config import ConfigError, check_device_name

NVIDIA_GPUS_GLOB = "/proc/driver/nvidia/gpus/*"  # one folder per GPU, whatever is visible


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA, then Apple MPS, then CPU; ``cuda:N`` is the N-th visible GPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(check_device_name(name))
    if device.type == "cuda":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= visible:
            raise ConfigError(
                f"config key 'device' is {name!r} but {visible} CUDA device(s) are visible "
                f"here{_visibility()}"
            )
    return device


def machine_gpus() -> int:
    """NVIDIA GPUs the driver knows on this machine, visible to this process or not."""
    return len(glob.glob(NVIDIA_GPUS_GLOB))


def describe(device: torch.device) -> str:
    """``device`` with what it is: ``cuda:0 (NVIDIA H100 80GB HBM3, 79.1 GiB)``, and where
    this process is bounded to a share of it (:func:`cap_gpu_memory`), that share."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        total = props.total_memory / 2**30
        fraction = torch.cuda.get_per_process_memory_fraction(device)
        bound = f", at most {fraction:.0%}: {fraction * total:.1f} GiB" if 0 < fraction < 1 else ""
        return f"{device} ({props.name}, {total:.1f} GiB{bound})"
    if device.type == "cpu":
        threads = torch.get_num_threads()
        return f"cpu ({threads} thread{'' if threads == 1 else 's'})"
    return str(device)


def cap_gpu_memory(device: torch.device, fraction: float | None) -> None:
    """Bound this process's allocations on ``device`` to ``fraction`` of its memory (several
    nodes sharing one GPU: one that grows does not take the others' memory); :func:`describe`
    then says it."""
    if device.type == "cuda" and fraction and fraction < 1:
        torch.cuda.set_per_process_memory_fraction(fraction, device)


def unused_gpus_warning(device: torch.device) -> str | None:
    """Why a node trains on the CPU of a machine with GPUs, and how to use them; None if
    it does not."""
    gpus = machine_gpus()
    if device.type != "cpu" or gpus == 0:
        return None
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is a CPU build: install a CUDA build of torch"
    else:
        why = (
            f"none is visible to this process{_visibility()}; under plain `flwr run` give "
            'each client a GPU share: --federation-config "client-resources-num-gpus=0.25" '
            "(dept run does this for you), or set device='cuda' to make it an error"
        )
    return f"training on the CPU although this machine has {gpus} NVIDIA GPU(s): {why}"


def _visibility() -> str:
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if shown is None else f" (CUDA_VISIBLE_DEVICES={shown!r})"


def idle_cores() -> int:
    """The cores this process may use that the machine is not already busy with (the
    1-minute load average taken off), at least 1. Torch takes every core by default, and
    on cores others keep busy its threads wait on each other: a fine-tune beside two busy
    processes on 2 cores ran 3x slower with 2 threads than with 1."""
    cores = len(os.sched_getaffinity(0))
    return max(1, min(cores, round(cores - os.getloadavg()[0])))


def size_cpu_threads(device: torch.device, asked: int = 0) -> int | None:
    """On a CPU, torch's threads set to ``asked``, or where 0 to :func:`idle_cores`; the
    count set (None on another device, whose kernels are not torch's CPU threads)."""
    if device.type != "cpu":
        return None
    torch.set_num_threads(asked or idle_cores())
    return torch.get_num_threads()
