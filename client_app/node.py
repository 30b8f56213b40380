"""Which source a node serves, and where it keeps its state.

Simulation: ``partition-id`` indexes the sources of the run config's sources file (or the
built-in default). Deployment: ``--node-config "source=<name> path=<data> ..."`` defines the
source completely (any sources-file key: ``vocab-size``, ``text-column``, ...), plus the
node-only keys ``state-dir`` and ``global-tokenizer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dept.config import ConfigError, DeptConfig, resolve_path
from dept.sources import SourceSpec, check_source_paths, parse_source, run_sources
from dept.workspace import default_state_root

NODE_ONLY_KEYS = ("state-dir", "global-tokenizer")
SIMULATION_KEYS = ("partition-id", "num-partitions")


@dataclass
class NodeSetup:
    spec: SourceSpec
    all_sources: list[SourceSpec]
    state_root: Path
    global_tokenizer: Path | None


def node_setup(cfg: DeptConfig, node_config: dict[str, Any]) -> NodeSetup:
    """Resolve this node's source from its node config; fail with a message naming the key."""
    state = node_config.get("state-dir") or cfg.state_dir
    state_root = resolve_path(str(state)) if state else default_state_root()
    tokenizer = node_config.get("global-tokenizer")
    global_tokenizer = resolve_path(str(tokenizer)) if tokenizer else None
    if "source" in node_config:
        entry = {
            "name" if k == "source" else k: v
            for k, v in node_config.items()
            if k not in NODE_ONLY_KEYS and k not in SIMULATION_KEYS
        }
        spec = parse_source(entry, Path.cwd())
        all_sources = [spec]
    elif "partition-id" in node_config:
        all_sources = run_sources(cfg)
        index = int(node_config["partition-id"])
        if index >= len(all_sources):
            raise ConfigError(
                f"node partition-id {index} has no source: the run declares {len(all_sources)} "
                "sources; run as many SuperNodes as sources"
            )
        spec = all_sources[index]
    else:
        raise ConfigError(
            "node config has neither 'source' (deployment) nor 'partition-id' "
            '(simulation); start the SuperNode with --node-config "source=NAME path=DIR"'
        )
    if cfg.variant != "spec-opt" and "source" in node_config and global_tokenizer is None:
        raise ConfigError(
            f"variant {cfg.variant!r} needs the run's shared global tokenizer on every node: "
            'start the SuperNode with --node-config "... global-tokenizer=/path/tokenizer.json"'
        )
    check_source_paths([spec])
    return NodeSetup(spec, all_sources, state_root, global_tokenizer)
