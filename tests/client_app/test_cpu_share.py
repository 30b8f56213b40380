"""A simulated client trains on its share of the cores (client_app.cpu_share); elsewhere
the threads its process was given stay."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import torch

from client_app.cpu_share import share_threads, use_cpu_share

WORKER_MODE, SCRIPT_MODE = 1, 0


def fake_ray(mode: int, cpus: float | None) -> types.ModuleType:
    """A stand-in for the loaded ``ray`` module of a process in ``mode`` with ``cpus``."""
    resources = {} if cpus is None else {"CPU": cpus}
    context = types.SimpleNamespace(
        worker=types.SimpleNamespace(mode=mode), get_assigned_resources=lambda: resources
    )
    ray = types.ModuleType("ray")
    ray.WORKER_MODE = WORKER_MODE  # type: ignore[attr-defined]
    ray.is_initialized = lambda: True  # type: ignore[attr-defined]
    ray.get_runtime_context = lambda: context  # type: ignore[attr-defined]
    return ray


@pytest.fixture
def threads_restored() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("assigned", "nodes", "cores", "omp", "threads"),
    [
        (1.0, 4, 2, None, 1),  # dept run on 2 cores: one CPU each
        (2.0, 2, 2, None, 2),  # plain flwr run: Flower's default of 2 CPUs an actor
        (0.5, 4, 2, None, 1),  # a fraction of a CPU still gets a thread
        (4.0, 4, 16, "8", 4),  # an inherited OMP_NUM_THREADS asks for more: the share wins
        (4.0, 4, 16, "2", 2),  # ... for fewer: it is honoured
        (None, 4, 2, None, 1),  # no CPU assigned: the cores over the nodes
        (None, 2, 16, None, 8),
    ],
)
def test_the_share_is_the_assigned_cpus_or_the_cores_over_the_nodes(
    monkeypatch: pytest.MonkeyPatch,
    assigned: float | None,
    nodes: int,
    cores: int,
    omp: str | None,
    threads: int,
) -> None:
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert share_threads(assigned, {"num-partitions": nodes}, cores) == threads


@pytest.mark.usefixtures("threads_restored")
def test_a_ray_actor_trains_on_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # as a shell of the user's might say
    monkeypatch.setitem(sys.modules, "ray", fake_ray(WORKER_MODE, 1.0))
    torch.set_num_threads(2)
    use_cpu_share({"partition-id": 0, "num-partitions": 4})
    assert torch.get_num_threads() == 1


@pytest.mark.usefixtures("threads_restored")
@pytest.mark.parametrize("ray", [None, fake_ray(SCRIPT_MODE, 1.0)])
def test_outside_an_actor_the_threads_stay(
    monkeypatch: pytest.MonkeyPatch, ray: types.ModuleType | None
) -> None:
    if ray is None:
        monkeypatch.delitem(sys.modules, "ray", raising=False)
    else:
        monkeypatch.setitem(sys.modules, "ray", ray)
    torch.set_num_threads(2)
    use_cpu_share({"partition-id": 0, "num-partitions": 4})
    assert torch.get_num_threads() == 2
