"""Reading a run configuration: its layers (the app's pyproject defaults, an optional YAML
file, ``--run-config`` overrides, in rising precedence) merged over the schema by omegaconf,
so that an unknown key, a wrong type or an impossible value is a
:class:`~dept.config.names.ConfigError` naming the key; and the schema's keys listed, for
``--help`` and the configuration reference."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dept.config.names import ConfigError, kebab, snake
from dept.config.schema import DeptConfig

T = TypeVar("T")


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
    types = get_type_hints(schema_cls)
    try:
        for layer in layers:
            unknown = sorted(k for k in layer if "_" in k or snake(k) not in known)
            if unknown:
                listed = schema_cls is DeptConfig
                raise ConfigError(f"{where}: {_unknown_keys(unknown, known, listed)}")
            _refuse_quoted_numbers(layer, types, where)
            schema = OmegaConf.merge(schema, {snake(k): v for k, v in layer.items()})
        obj = OmegaConf.to_object(schema)
    except OmegaConfBaseException as exc:
        key = kebab(str(getattr(exc, "full_key", None) or getattr(exc, "key", None) or "?"))
        problem = str(getattr(exc, "msg", exc)).strip().splitlines()[0]  # omegaconf adds lines
        raise ConfigError(f"{where} key '{key}': {problem}") from exc
    assert isinstance(obj, schema_cls)
    return obj


def _unknown_keys(unknown: list[str], known: set[str], run_config: bool) -> str:
    """What is wrong with ``unknown``: the closest known key of each where one is near
    (``num-server-round``: did you mean ``num-server-rounds``?), and where the keys are: the
    run config's in ``dept run --help``; a smaller schema's (a source's, a node's), named."""
    names = sorted(kebab(k) for k in known)
    guesses = [
        f"{k} (did you mean {close[0]}?)" if (close := get_close_matches(kebab(k), names, 1)) else k
        for k in unknown
    ]
    where = "listed by dept run --help" if run_config else f"one of: {', '.join(names)}"
    return f"unknown key(s) {', '.join(guesses)}; keys are kebab-case, {where}"


def _refuse_quoted_numbers(layer: dict[str, Any], types: dict[str, Any], where: str) -> None:
    """A number or a switch written as a string (``lr='0.01'``) is a mistake omegaconf would
    quietly convert; the schema's promise is that a wrong type fails, naming the key."""
    for key, value in layer.items():
        wanted = types.get(snake(key))
        if isinstance(value, str) and wanted in (int, float, bool):
            raise ConfigError(
                f"{where} key '{key}' is the string {value!r}; write it as a "
                f"{'true/false' if wanted is bool else 'number'}, without quotes"
            )


class YamlLoader(yaml.SafeLoader):
    """YAML as people write it: PyYAML (YAML 1.1) reads ``1e-3`` as a string, YAML 1.2 and
    every other tool as a float."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _read_yaml_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=YamlLoader) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of run config keys")
    return data


def to_run_config(cfg: DeptConfig) -> dict[str, Any]:
    """The flat kebab-case mapping Flower expects (inverse of :func:`load_config`)."""
    return {kebab(f.name): getattr(cfg, f.name) for f in fields(DeptConfig)}


@dataclass(frozen=True)
class ConfigKey:
    """One run config key as ``dept run --help`` and docs/configuration.md present it."""

    key: str  # kebab-case, as in ``--run-config``
    default: Any
    kind: str  # int, float, bool, str, or the choices: glob|trim|spec|spec-opt
    doc: str

    @property
    def shown_default(self) -> str:
        """The default as the reference page writes it: TOML's true/false, "" for no string."""
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, str):
            return self.default or '""'
        return repr(self.default)


def config_keys() -> list[ConfigKey]:
    """Every run config key, in schema order, with its default, type or choices and doc."""
    hints = get_type_hints(DeptConfig)
    return [
        ConfigKey(kebab(f.name), f.default, _kind(hints[f.name]), f.metadata["doc"])
        for f in fields(DeptConfig)
    ]


def _kind(hint: Any) -> str:
    return "|".join(get_args(hint)) if get_origin(hint) is Literal else hint.__name__
