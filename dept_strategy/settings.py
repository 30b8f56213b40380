"""What a :class:`dept_strategy.strategy.DeptStrategy` is told, in one checked object.

The server builds it from the run config (:func:`server_app.federation.strategy_settings`);
tests and benchmarks name only what they vary. A value no run could use fails here, when
the strategy is made, before any node is asked anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dept.config import COMPRESSIONS, DOWNLOADS, SERVER_MEMORIES, privacy_conflict
from dept.config.checks import check_range
from dept.model.variants import EMBEDDING_ROWS
from dept.wire.compression import TOPK_DENSITY
from dept_strategy.privacy import CentralPrivacy
from dept_strategy.screening import Defences


@dataclass(frozen=True)
class StrategySettings:
    """The strategy's settings (run config keys in brackets where they come from one)."""

    run_id: str
    local_steps: int  # (local-steps)
    fraction_train: float = 1.0  # (fraction-train), in (0, 1]
    min_train_nodes: int = 1  # (min-train-nodes)
    min_train_replies: int = 1  # (min-train-replies)
    fraction_evaluate: float = 1.0  # (fraction-evaluate), in [0, 1]
    min_available_nodes: int = 1  # (min-available-nodes)
    wait_for_nodes_s: float = 120.0  # (wait-for-nodes-s)
    query_timeout_s: float = 600.0  # how long a round waits for a node asked the first time
    max_tokens_per_round: float = math.inf  # a reply claiming more tokens is refused
    num_server_rounds: int = 0  # (num-server-rounds): every source is evaluated after the last
    seed: int = 0  # (seed): sampling
    # the φ tensors among the outer optimizer's (GLOB, TRIM)
    embedding_names: tuple[str, ...] = ()
    trim: bool = False  # send each source only its V_k rows of them (TRIM)
    embedding_rows: str = "all"  # (embedding-rows): which φ rows a reply carries
    embedding_row_weight: str = "tokens"  # (embedding-row-weight): a sent row's weight
    compression: str = "none"  # (compression): how clients encode what they send up
    topk_density: float = TOPK_DENSITY  # (topk-density)
    spool_dir: Path | None = None  # where a round's replies wait (default: a temporary folder)
    server_memory: str = "fast"  # (server-memory): lean folds the mean from the spool at the end
    defences: Defences = field(default_factory=Defences)  # how replies are screened, combined
    privacy: CentralPrivacy = field(default_factory=CentralPrivacy)  # central DP, off by default
    pinned: dict[str, bytes] | None = None  # source -> the node key that may serve it
    interference: bool = True  # (interference): cosines between every pair of updates
    fragments: int = 1  # (fragments): > 1 syncs the body by that many fragments
    fragment_period: int = 1  # (fragment-period): each fragment syncs every this many rounds
    download_compression: str = "none"  # (download-compression): θ's change going down
    # Flower's simulation runtime: no SuperNode holds a reply back and none is lost without
    # an error reply, so a node slow to answer is queued behind others on an actor, not
    # silent: it is waited for (up to the round's timeout), never asked again nor nudged
    simulation: bool = False
    # central DP on: the screening keys it turned off (they judge an update by the others')
    off_for_privacy: tuple[str, ...] = field(default=(), init=False)

    @classmethod
    def from_config(cls, cfg: Any, **runtime: Any) -> StrategySettings:
        """The settings of a run config (a :class:`dept.config.DeptConfig`): every field named
        as a config key is that key's value; ``runtime`` gives the rest (the run id, the φ
        names, the spool folder, the defences, ...)."""
        named = {
            f.name: getattr(cfg, f.name)
            for f in fields(cls)
            if f.init and f.name not in runtime and hasattr(cfg, f.name)
        }
        return cls(**named, **runtime)

    def __post_init__(self) -> None:
        # at least one source is sampled, and one reply changes the model (0 means that too)
        object.__setattr__(self, "min_train_nodes", max(1, self.min_train_nodes))
        object.__setattr__(self, "min_train_replies", max(1, self.min_train_replies))
        for name in ("local_steps", "fraction_train", "fraction_evaluate", "topk_density"):
            check_range(name, getattr(self, name), where="strategy setting")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        if self.download_compression not in DOWNLOADS:
            raise ValueError(f"download_compression must be one of {DOWNLOADS}")
        if self.download_compression != "none" and self.fragments > 1:
            raise ValueError("download_compression needs fragments = 1")
        if self.server_memory not in SERVER_MEMORIES:
            raise ValueError(f"server_memory must be one of {SERVER_MEMORIES}")
        if self.embedding_rows not in EMBEDDING_ROWS:
            raise ValueError(f"embedding_rows must be one of {EMBEDDING_ROWS}")
        if self.privacy.on:
            some_rows = self.trim or self.embedding_rows == "seen"
            why = privacy_conflict(self.defences.aggregation, some_rows, self.fragments)
            if why:
                raise ValueError(f"central differential privacy: {why}")
            # each source screened on its own: a check against the others breaks the bound
            object.__setattr__(self, "off_for_privacy", self.defences.against_others)
            object.__setattr__(self, "defences", self.defences.each_on_its_own())
