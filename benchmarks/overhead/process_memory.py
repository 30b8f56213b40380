"""What this process and this machine hold in memory, read from Linux's /proc: the resident
set now and at its peak (which :func:`reset_peak` starts again), and what the machine can
still give."""

from __future__ import annotations


def rss_bytes() -> int:
    """Resident memory now (Linux)."""
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """The most resident memory since the last :func:`reset_peak` (Linux)."""
    return _status_kib("VmHWM") * 1024


def reset_peak() -> None:
    """Start the peak again from now (Linux ≥ 4.0: writing 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1])


def available_gb() -> float:
    """Memory the machine can give now (Linux's MemAvailable), in GB."""
    with open("/proc/meminfo") as f:
        line = next(line for line in f if line.startswith("MemAvailable:"))
    return int(line.split()[1]) * 1024 / 1e9
