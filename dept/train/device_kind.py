"""The kind of device a run's ``device`` value means on this machine, without importing
torch where the machine has no accelerator: ``dept run`` sizes a run before it starts, and
importing torch would cost its checks a second.

torch reaches a GPU through the device files its driver makes: NVIDIA's ``/dev/nvidia<N>``,
ROCm's ``/dev/kfd``, WSL's ``/dev/dxg``; Apple's MPS only on macOS. Where none is present,
torch finds no GPU either, so ``auto`` means the CPU and no GPU is visible. Where one is,
torch decides (:func:`dept.train.devices.resolve_device`).
"""

from __future__ import annotations

import glob
import sys

GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def accelerator_possible() -> bool:
    """Whether torch could find a GPU or MPS here."""
    return sys.platform == "darwin" or any(glob.glob(files) for files in GPU_DEVICE_FILES)


def device_kind(name: str) -> str:
    """``cuda``, ``mps`` or ``cpu``: what ``name`` (a checked ``device`` value) trains on
    here; a ``ConfigError`` for a GPU that is not there, as :func:`resolve_device` gives."""
    if name in ("cpu", "mps"):
        return name
    if name == "auto" and not accelerator_possible():
        return "cpu"
    from dept.train.devices import resolve_device

    return resolve_device(name).type
