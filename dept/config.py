"""The run configuration: one typed schema, validated before any work starts.

Flower hands the app a flat mapping with kebab-case keys (``local-steps``); the schema uses the
snake_case form of the same names. Values come from, in order of precedence: ``--run-config``
overrides, an optional YAML file, and the defaults in ``pyproject.toml`` (which mirror the
defaults below). Any unknown key, wrong type or impossible value raises :class:`ConfigError`
naming the key.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dept.outer_optimizers import OUTER_OPTIMIZERS, OuterName
from dept.variants import VariantName

DEVICES = ("auto", "cpu", "cuda", "mps")
COMPRESSIONS = ("none", "fp16", "int8")  # of the pseudo-gradients sent up (dept.compression)
AGGREGATIONS = ("mean", "trimmed-mean", "median")  # how a round's updates are combined
OUTLIER_ACTIONS = ("clip", "reject")  # what becomes of an update too large to be honest
BASE_DIR_ENV = "DEPT_HOME"
MAX_VOCAB_SIZE = 1 << 20  # larger vocabularies are not trained here (a typo, not a plan)
T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid; the message names the key."""


def kebab(name: str) -> str:
    """Schema field name -> run config key (``local_steps`` -> ``local-steps``)."""
    return name.replace("_", "-")


def snake(key: str) -> str:
    """Run config key -> schema field name."""
    return key.replace("-", "_")


@dataclass
class DeptConfig:
    """Every run config key of the app. Field docstrings live in README's config table."""

    variant: VariantName = "spec-opt"
    model: str = "tiny"
    tie_embeddings: bool = True
    num_server_rounds: int = 3
    local_steps: int = 25
    seq_len: int = 128
    batch_size: int = 8
    grad_accum_steps: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    keep_inner_optimizer: bool = True
    outer_optimizer: OuterName = "fedavg"
    outer_lr: float = 1.0
    outer_momentum: float = 0.9
    compression: str = "none"
    compression_error_feedback: bool = True
    aggregation: str = "mean"
    outlier_action: str = "clip"
    trim_fraction: float = 0.2
    update_norm_factor: float = 10.0
    fraction_train: float = 1.0
    min_train_nodes: int = 1
    min_train_replies: int = 1
    fraction_evaluate: float = 1.0
    min_available_nodes: int = 0
    wait_for_nodes_s: float = 120.0
    round_timeout_s: float = 3600.0
    global_vocab_size: int = 4096
    eval_bytes: int = 65536
    eval_batch_size: int = 16
    seed: int = 0
    device: str = "auto"
    sources_file: str = ""
    source_keys_file: str = ""
    output_dir: str = "outputs/dept"
    state_dir: str = ""
    resume: bool = False

    def __post_init__(self) -> None:
        self._check_model()
        _check_choice("device", self.device, DEVICES)
        _check_choice("compression", self.compression, COMPRESSIONS)
        _check_choice("aggregation", self.aggregation, AGGREGATIONS)
        _check_choice("outlier-action", self.outlier_action, OUTLIER_ACTIONS)
        for name in (
            "num_server_rounds",
            "local_steps",
            "seq_len",
            "batch_size",
            "grad_accum_steps",
            "eval_batch_size",
            "min_train_replies",
        ):
            _check(name, getattr(self, name) >= 1, "must be >= 1")
        for name in (
            "warmup_steps",
            "min_available_nodes",
            "eval_bytes",
            "min_train_nodes",
            "seed",
        ):
            _check(name, getattr(self, name) >= 0, "must be >= 0")
        for field in fields(self):
            value = getattr(self, field.name)
            _check(
                field.name, not isinstance(value, float) or math.isfinite(value), "must be finite"
            )
        _check(
            "warmup_steps",
            self.warmup_steps < self.total_steps,
            f"({self.warmup_steps}) must be smaller than num-server-rounds x local-steps "
            f"({self.total_steps}), or the learning rate never decays",
        )
        outer = OUTER_OPTIMIZERS[self.outer_optimizer]
        _check(
            "outer_momentum",
            not outer.uses_momentum or self.outer_momentum > 0,
            f"must be > 0 with outer-optimizer {self.outer_optimizer!r}",
        )
        _check("lr", self.lr > 0, "must be > 0")
        _check("outer_lr", self.outer_lr > 0, "must be > 0")
        _check("outer_momentum", 0 <= self.outer_momentum < 1, "must be in [0, 1)")
        _check("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "must be in [0, 1]")
        _check("weight_decay", self.weight_decay >= 0, "must be >= 0")
        _check("grad_clip", self.grad_clip >= 0, "must be >= 0 (0 disables clipping)")
        _check("trim_fraction", 0 < self.trim_fraction < 0.5, "must be in (0, 0.5)")
        _check(
            "update_norm_factor",
            self.update_norm_factor == 0 or self.update_norm_factor > 1,
            "must be 0 (off) or > 1: a reply is refused beyond this many times the round's "
            "median size",
        )
        _check("fraction_train", 0 < self.fraction_train <= 1, "must be in (0, 1]")
        _check("fraction_evaluate", 0 <= self.fraction_evaluate <= 1, "must be in [0, 1]")
        _check("wait_for_nodes_s", self.wait_for_nodes_s > 0, "must be > 0")
        _check("round_timeout_s", self.round_timeout_s > 0, "must be > 0")
        _check(
            "global_vocab_size",
            300 <= self.global_vocab_size <= MAX_VOCAB_SIZE,
            f"must be in [300, {MAX_VOCAB_SIZE:,}]",
        )
        _check(
            "outer_lr",
            self.outer_lr <= outer.lr_cap,
            f"({self.outer_lr:g}) must be <= {outer.lr_cap:g} with outer-optimizer "
            f"{self.outer_optimizer!r}: {outer.why_cap}",
        )
        _check("output_dir", bool(self.output_dir.strip()), "must not be empty")

    def _check_model(self) -> None:
        from dept.model import build_config  # late import: model pulls in torch

        try:
            build_config(self.model, 512, self.seq_len, self.tie_embeddings)
        except ValueError as exc:
            raise ConfigError(f"config key 'model': {exc}") from exc

    @property
    def total_steps(self) -> int:
        """Length of the one global learning-rate schedule (all rounds)."""
        return self.num_server_rounds * self.local_steps


def _check(name: str, ok: bool, why: str, where: str = "config") -> None:
    if not ok:
        raise ConfigError(f"{where} key '{kebab(name)}' {why}")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"config key '{key}' is {value!r}; expected one of {', '.join(choices)}")


def base_dir() -> Path:
    """Where relative run-config paths resolve: ``$DEPT_HOME`` if set, else the working dir."""
    return Path(os.environ.get(BASE_DIR_ENV) or os.getcwd())


def resolve_path(value: str, base: Path | None = None) -> Path:
    """Expand ``~`` and make ``value`` absolute against ``base`` (default :func:`base_dir`)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base or base_dir()) / path


def load_config(
    run_config: Mapping[str, Any],
    yaml_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> DeptConfig:
    """Validate ``run_config`` (+ YAML file, + overrides) against :class:`DeptConfig`.

    All three use the kebab-case keys of the Flower run config.
    """
    layers = [dict(run_config)]
    if yaml_file is not None:
        layers.append(_read_yaml_mapping(Path(yaml_file)))
    if overrides:
        layers.append(dict(overrides))
    return build_structured(DeptConfig, layers, where="config")


def build_structured(schema_cls: type[T], layers: list[dict[str, Any]], where: str) -> T:
    """Merge kebab-case ``layers`` over the dataclass ``schema_cls`` with omegaconf checks.

    ``where`` prefixes error messages (e.g. ``config`` or ``source 'de-novels'``).
    """
    schema = OmegaConf.structured(schema_cls)
    known = {f.name for f in fields(schema_cls)}  # type: ignore[arg-type]
    try:
        for layer in layers:
            unknown = sorted(k for k in layer if "_" in k or snake(k) not in known)
            if unknown:
                raise ConfigError(
                    f"{where}: unknown key(s) {', '.join(unknown)} (keys are kebab-case; known: "
                    f"{', '.join(sorted(kebab(k) for k in known))})"
                )
            schema = OmegaConf.merge(schema, {snake(k): v for k, v in layer.items()})
        obj = OmegaConf.to_object(schema)
    except OmegaConfBaseException as exc:
        key = kebab(str(getattr(exc, "full_key", None) or getattr(exc, "key", None) or "?"))
        problem = str(getattr(exc, "msg", exc)).strip().splitlines()[0]  # omegaconf adds lines
        raise ConfigError(f"{where} key '{key}': {problem}") from exc
    assert isinstance(obj, schema_cls)
    return obj


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of run config keys")
    return data


def to_run_config(cfg: DeptConfig) -> dict[str, Any]:
    """The flat kebab-case mapping Flower expects (inverse of :func:`load_config`)."""
    return {kebab(f.name): getattr(cfg, f.name) for f in fields(DeptConfig)}
