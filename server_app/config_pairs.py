"""``-c`` / ``--run-config`` and ``--node-config`` strings, written and read as Flower reads them
(``key=value`` pairs, each value a TOML scalar), with a refusal that names the pair that
does not read and how to write it: Flower's own message shows only the general format, and
the commonest slip, a string without quotes (``source=de``), is not in it."""

from __future__ import annotations

import json
import re
from typing import Any

import click
from flwr.common.config import parse_config_args

from dept.config import ConfigError

PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")  # as flwr.common.config matches them


def parse_pairs(texts: list[str] | None, option: str) -> dict[str, Any]:
    """The pairs of ``texts`` (what ``option`` was given), as Flower's ``parse_config_args``
    returns them; a ConfigError naming each pair that does not read, with the quoted form a
    bare string needs, and any word that is no pair (Flower would drop it unsaid)."""
    stray = [
        w for text in texts or [] if not text.endswith(".toml") for w in PAIR.sub(" ", text).split()
    ]
    try:
        if stray:
            raise click.ClickException(f"{', '.join(stray)}: not a key=value pair")
        return parse_config_args(texts)
    except click.ClickException as exc:
        bad = [_why(key, value) for text in texts or [] for key, value in PAIR.findall(text)]
        named = "; ".join([b for b in bad if b] + ([exc.message] if stray else []))
        raise ConfigError(
            f"{option}: {named or exc.message} (pairs are key=value, space-separated; "
            "strings in quotes: -c \"variant='spec' lr=0.01\")"
        ) from exc


def _why(key: str, value: str) -> str:
    """Why ``key=value`` does not read as a TOML pair ('' where it does)."""
    try:
        parse_config_args([f"{key}={value}"])
    except click.ClickException:
        if re.fullmatch(r"[^'\"\s]+", value):
            return f"{key}={value}: a string needs quotes, {key}='{value}'"
        return f"{key}={value} is not a number, true/false or a quoted string"
    return ""


def pairs_text(pairs: dict[str, Any]) -> str:
    """``pairs`` as one ``--run-config`` or ``--node-config`` string (what
    :func:`parse_pairs` reads back)."""
    return " ".join(f"{key}={_toml(value)}" for key, value in pairs.items())


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: quotes and backslashes escaped
    return repr(value)
