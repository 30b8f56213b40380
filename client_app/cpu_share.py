"""Torch's CPU threads in a simulated client: its share of the cores, never all of them.

Ray gives each ClientApp actor ``client-resources-num-cpus`` CPUs and runs as many actors at
once as the cores hold. torch takes what ``OMP_NUM_THREADS`` says, which a user's shell may
set to anything and Ray sets only where it is unset. More threads than the actor's share
oversubscribe the cores: an intra-op thread waits on a sibling that lost its core, and a
step of milliseconds takes seconds (four sources on two cores beside one busy process:
about 300 tokens/s where a quiet machine trains 11,000). Each actor therefore trains on
exactly its share: the CPUs Ray assigned it, else the cores split over the simulated nodes.

Only a Ray actor is touched: the in-process federation of the tests and a deployment's warm
worker keep the threads their process was given.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def _ray_worker() -> Any | None:
    """Ray's runtime context where this runs in a Ray worker (a simulation's actor), else
    None. Ray is looked for, not imported: an actor has it loaded already."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return context if context.worker.mode == ray.WORKER_MODE else None


def share_threads(assigned: float | None, node_config: Mapping[str, Any], cores: int) -> int:
    """Threads for a client: the whole CPUs it was assigned (at least one), else the cores
    over the simulation's nodes (``num-partitions``), and never more than an explicit
    ``OMP_NUM_THREADS`` asks for."""
    if assigned:
        threads = max(1, int(assigned))
    else:
        nodes = int(node_config.get("num-partitions", 1) or 1)
        threads = max(1, cores // nodes)
    asked = os.environ.get("OMP_NUM_THREADS", "")
    return min(threads, int(asked)) if asked.isdigit() and int(asked) > 0 else threads


def use_cpu_share(node_config: Mapping[str, Any]) -> None:
    """In a simulation's Ray actor, set torch's intra-op threads to the actor's share."""
    context = _ray_worker()
    if context is None:
        return
    import torch

    assigned = context.get_assigned_resources().get("CPU")
    threads = share_threads(assigned, node_config, len(os.sched_getaffinity(0)))
    if torch.get_num_threads() != threads:
        log.debug(
            "torch threads %d -> %d: this client's CPU share", torch.get_num_threads(), threads
        )
        torch.set_num_threads(threads)
