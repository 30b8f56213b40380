"""The checks across run config keys that no type can say, run as a config is made
(:class:`dept.config.schema.DeptConfig`): each failure names its key and why."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from dept.config.names import DEVICE_PATTERN, MAX_VOCAB_SIZE, ConfigError, kebab
from dept.model.outer_optimizers import OUTER_OPTIMIZERS
from dept.model.variants import VARIANTS

# Constraints on one value, each stated once: the run config's checks below ask them, and so
# do the settings a strategy is made with (dept_strategy.settings, dept_strategy.privacy), which
# tests and benchmarks make without a run config.
RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "local_steps": (lambda v: v >= 1, "must be >= 1"),
    "fraction_train": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "fraction_evaluate": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "topk_density": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "dp_noise_multiplier": (lambda v: v >= 0, "must be >= 0 (0: off)"),
    "dp_clip_norm": (lambda v: v > 0, "must be > 0"),
    "dp_delta": (lambda v: 0 < v < 1, "must be in (0, 1)"),
}


def check_range(name: str, value: float, where: str = "config") -> None:
    """A :class:`ConfigError` naming ``name`` where ``value`` is outside its :data:`RANGES`
    (``where``: whose key it is: the run config's, or a setting's)."""
    ok, why = RANGES[name]
    _check(name, math.isfinite(value) and ok(value), why, where)


def check_values(cfg: Any) -> None:
    """A :class:`ConfigError` naming the first key of ``cfg`` (a
    :class:`~dept.config.schema.DeptConfig`, which calls this as it is made, so it is not
    imported here) whose value no run could use."""
    for name in RANGES:
        check_range(name, getattr(cfg, name))
    for name in (
        "num_server_rounds",
        "seq_len",
        "batch_size",
        "grad_accum_steps",
        "eval_batch_size",
        "min_train_replies",
    ):
        _check(name, getattr(cfg, name) >= 1, "must be >= 1")
    for name in (
        "warmup_steps",
        "act_period",
        "min_available_nodes",
        "eval_bytes",
        "min_train_nodes",
        "seed",
        "empty_round_retries",
    ):
        _check(name, getattr(cfg, name) >= 0, "must be >= 0")
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        _check(f.name, not isinstance(value, float) or math.isfinite(value), "must be finite")
    outer = OUTER_OPTIMIZERS[cfg.outer_optimizer]
    _check(
        "outer_momentum",
        not outer.uses_momentum or cfg.outer_momentum > 0,
        f"must be > 0 with outer-optimizer {cfg.outer_optimizer!r}",
    )
    _check("lr", cfg.lr > 0, "must be > 0")
    check_device_name(cfg.device)
    _check("outer_lr", cfg.outer_lr > 0, "must be > 0")
    _check("outer_momentum", 0 <= cfg.outer_momentum < 1, "must be in [0, 1)")
    _check("min_lr_ratio", 0 <= cfg.min_lr_ratio <= 1, "must be in [0, 1]")
    _check("weight_decay", cfg.weight_decay >= 0, "must be >= 0")
    _check("round_time_s", cfg.round_time_s >= 0, "must be >= 0 seconds (0: off)")
    _check("step_delay_s", cfg.step_delay_s >= 0, "must be >= 0 seconds")
    _check(
        "max_local_steps",
        cfg.max_local_steps == 0 or cfg.max_local_steps >= cfg.local_steps,
        f"({cfg.max_local_steps}) must be 0 (local-steps) or >= local-steps "
        f"({cfg.local_steps}): a round without a budget trains local-steps",
    )
    _check("grad_clip", cfg.grad_clip >= 0, "must be >= 0 (0 disables clipping)")
    _check("trim_fraction", 0 < cfg.trim_fraction < 0.5, "must be in (0, 0.5)")
    _check(
        "update_norm_factor",
        cfg.update_norm_factor == 0 or cfg.update_norm_factor > 1,
        "must be 0 (off) or > 1: a reply is refused beyond this many times the round's median size",
    )
    _check("direction_factor", cfg.direction_factor >= 0, "must be >= 0 (0: off)")
    _check(
        "flatness_factor",
        cfg.flatness_factor == 0 or cfg.flatness_factor > 1,
        "must be 0 (off) or > 1",
    )
    shares = VARIANTS[cfg.variant].embeddings
    some_rows = shares == "rows" or (shares == "all" and cfg.embedding_rows == "seen")
    conflict = privacy_conflict(cfg.aggregation, some_rows, cfg.fragments)
    _check("dp_noise_multiplier", cfg.dp_noise_multiplier == 0 or not conflict, conflict)
    _check("fragments", cfg.fragments >= 1, "must be >= 1")
    _check(
        "fragment_period",
        1 <= cfg.fragment_period <= cfg.fragments,
        "must be in 1..fragments (every round syncs at least one fragment)",
    )
    _check(
        "download_compression",
        cfg.download_compression == "none" or cfg.fragments == 1,
        "needs fragments = 1: with fragments a node already gets only the fragments it lacks",
    )
    _check("wait_for_nodes_s", cfg.wait_for_nodes_s > 0, "must be > 0")
    _check("round_timeout_s", cfg.round_timeout_s > 0, "must be > 0")
    _check(
        "global_vocab_size",
        300 <= cfg.global_vocab_size <= MAX_VOCAB_SIZE,
        f"must be in [300, {MAX_VOCAB_SIZE:,}]",
    )
    _check(
        "outer_lr",
        cfg.outer_lr <= outer.lr_cap,
        f"({cfg.outer_lr:g}) must be <= {outer.lr_cap:g} with outer-optimizer "
        f"{cfg.outer_optimizer!r}: {outer.why_cap}",
    )
    _check("output_dir", bool(cfg.output_dir.strip()), "must not be empty")
    _check_installed("tensorboard", cfg.tensorboard, "tensorboard")
    _check_installed("wandb_project", bool(cfg.wandb_project), "wandb")


def check_device_name(name: str, where: str = "config key 'device'") -> str:
    """``name`` if it names a device this project knows; a :class:`ConfigError` if not."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ConfigError(f"{where} is {name!r}: use auto, cpu, cuda, cuda:N or mps")
    return name


def _check(name: str, ok: bool, why: str, where: str = "config") -> None:
    if not ok:
        raise ConfigError(f"{where} key '{kebab(name)}' {why}")


def _check_installed(name: str, used: bool, package: str) -> None:
    """A tracker whose package is missing fails now, not at the end of the first round."""
    if used and importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"config key '{kebab(name)}' needs the {package} package: "
            f'pip install -e ".[{package}]"'
        )


def privacy_conflict(aggregation: str, some_rows: bool, fragments: int) -> str:
    """Why central DP (dp-noise-multiplier) cannot hold its ε with these settings; ""
    where it can (:mod:`dept_strategy.privacy`). ``some_rows``: a reply carries only some
    φ rows (trim, or embedding-rows=seen), each averaged over the sources that sent it."""
    if aggregation != "mean":
        return (
            f"aggregation {aggregation!r} ranks values across sources, so one source's "
            "effect on the result is not bounded by its clipped norm; use aggregation='mean'"
        )
    if some_rows:
        return (
            "each φ row is averaged over the sources that sent it (trim, or "
            "embedding-rows='seen'), so a source alone on a row sets it whatever the "
            "clipping; use glob with embedding-rows='all', spec or spec-opt"
        )
    if fragments > 1:
        return (
            "with fragments > 1 each round releases a different part of the body, which "
            "this accountant does not model; use fragments=1"
        )
    return ""
