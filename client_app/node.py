"""Which sources a node serves, and where it keeps their state.

Deployment: ``--node-config "source=<name> path=<data> ..."`` defines the node's one source
completely (any sources-file key: ``vocab-size``, ``text-column``, ``nproc``: its training on
that many processes or GPUs, ...), plus the node-only
keys ``state-dir``, ``global-tokenizer`` and ``device`` (``cuda:1``: several SuperNodes on
one machine, each on its own GPU; it wins over the run's ``device``), ``round-time-s`` (this
node's time budget per round, which wins over the run's) and ``step-delay-s`` (a testing
aid that slows this node). The last three apply in simulation too.

Simulation: ``partition-id`` indexes the sources of the run config (its sources file, or
the built-in default). With fewer simulated nodes than sources (``flwr run .`` starts two
unless told otherwise) node ``p`` of ``P`` serves sources ``p, p+P, p+2P, ...`` so every
source still takes part; with more nodes than sources the extra nodes serve none.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client_app.warm import FOLDER_KEY, IDLE_KEY, WARM_KEY
from dept.config import ConfigError, DeptConfig, check_device_name, snake
from dept.data.sources import SourceSpec, check_source_paths, parse_source, run_sources
from dept.model.variants import variant
from dept.paths import resolve_path, state_root

# The run config keys a node may set for itself (they win over the run's).
NODE_SECONDS_KEYS = ("round-time-s", "step-delay-s")
GPU_MEMORY_KEY = "gpu-memory-fraction"  # of its GPU this node's process may take, in (0, 1]
NODE_ONLY_KEYS = (
    "state-dir",
    "global-tokenizer",
    "device",
    *NODE_SECONDS_KEYS,
    WARM_KEY,
    IDLE_KEY,
    FOLDER_KEY,
    GPU_MEMORY_KEY,
)
SIMULATION_KEYS = ("partition-id", "num-partitions")


@dataclass
class NodeSetup:
    spec: SourceSpec
    all_sources: list[SourceSpec]
    state_root: Path
    global_tokenizer: Path | None
    device: str | None  # the node's own device=..., which wins over the run's
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # NODE_SECONDS_KEYS set
    gpu_memory_fraction: float | None = None  # GPU_MEMORY_KEY

    def own_config(self, cfg: DeptConfig) -> DeptConfig:
        """The run config as this node trains with it: its own device and seconds win."""
        own: dict[str, Any] = {snake(key): value for key, value in self.seconds.items()}
        if self.device:
            own["device"] = self.device
        return dataclasses.replace(cfg, **own)


def served_sources(
    cfg: DeptConfig, node_config: dict[str, Any]
) -> tuple[list[SourceSpec], list[SourceSpec]]:
    """(the sources this node serves, every source the node knows of), data paths and the
    node's own seconds checked: a bad one fails the node's first message, before training."""
    for key in NODE_SECONDS_KEYS:
        if key in node_config:
            _seconds(node_config, key)
    if "source" in node_config:
        entry = {
            "name" if k == "source" else k: v
            for k, v in node_config.items()
            if k not in NODE_ONLY_KEYS and k not in SIMULATION_KEYS
        }
        spec = parse_source(entry, Path.cwd())
        if not variant(cfg.variant).own_tokenizer and not node_config.get("global-tokenizer"):
            raise ConfigError(
                f"variant {cfg.variant!r} needs the run's shared global tokenizer on every node: "
                'start the SuperNode with --node-config "... global-tokenizer=/path/tokenizer.json"'
            )
        served, known = [spec], [spec]
    elif "partition-id" in node_config:
        known = run_sources(cfg)
        index = int(node_config["partition-id"])
        stride = int(node_config.get("num-partitions") or len(known))
        served = known[index::stride]
    else:
        raise ConfigError(
            "node config has neither 'source' (deployment) nor 'partition-id' "
            '(simulation); start the SuperNode with --node-config "source=NAME path=DIR"'
        )
    check_source_paths(served)
    return served, known


def node_setup(cfg: DeptConfig, node_config: dict[str, Any], source: str) -> NodeSetup:
    """Everything a client needs to act as ``source``, which this node must serve."""
    served, known = served_sources(cfg, node_config)
    by_name = {s.name: s for s in served}
    if source not in by_name:
        raise ConfigError(
            f"this node does not serve source {source!r} (it serves: "
            f"{', '.join(by_name) or 'none'})"
        )
    tokenizer = node_config.get("global-tokenizer")
    device = node_config.get("device")
    return NodeSetup(
        spec=by_name[source],
        all_sources=known,
        state_root=state_root(node_config, cfg.state_dir),
        global_tokenizer=resolve_path(str(tokenizer)) if tokenizer else None,
        device=check_device_name(str(device), "node config key 'device'") if device else None,
        seconds={k: _seconds(node_config, k) for k in NODE_SECONDS_KEYS if k in node_config},
        gpu_memory_fraction=_fraction(node_config),
    )


def _fraction(node_config: dict[str, Any]) -> float | None:
    """The node's ``gpu-memory-fraction``, a number in (0, 1], or a :class:`ConfigError`."""
    if GPU_MEMORY_KEY not in node_config:
        return None
    return _number(node_config, GPU_MEMORY_KEY, lambda x: 0 < x <= 1, "in (0, 1]")


def _seconds(node_config: dict[str, Any], key: str) -> float:
    """The node's ``key``, a number of seconds >= 0, or a :class:`ConfigError` naming it."""
    return _number(
        node_config, key, lambda x: math.isfinite(x) and x >= 0, "a number of seconds >= 0"
    )


def _number(
    node_config: dict[str, Any], key: str, accepts: Callable[[float], bool], rule: str
) -> float:
    """The node's ``key`` as a number that ``accepts`` takes, or a :class:`ConfigError`
    saying it must be ``rule`` (a bool or a non-number never is)."""
    value = node_config[key]
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not accepts(number):
        raise ConfigError(f"node config key {key!r} is {value!r}: must be {rule}")
    return number
