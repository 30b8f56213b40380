"""Every message of ours that suggests a ``dept`` command suggests one that exists, with
options that command takes (a hint once named ``resume=true``, which ``dept run`` has not)."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

from dept_cli.main import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dept", "dept_strategy", "server_app", "client_app", "dept_cli")
SUGGESTION = re.compile(r"\bdept ([a-z][a-z-]+)((?: --[a-z][a-z-]*)*)")


def suggestions() -> dict[str, set[str]]:
    """``{command: options}`` over every string literal (f-strings' parts too) of ours."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for match in SUGGESTION.finditer(node.value):
                        found.setdefault(match[1], set()).update(match[2].split())
    return found


def help_text(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return out.getvalue()


def test_every_suggested_command_exists_with_its_options() -> None:
    found = suggestions()
    assert {"run", "export", "compare"} <= found.keys(), "the walk finds the hints"
    assert set(found) <= set(COMMANDS), sorted(set(found) - set(COMMANDS))
    missing = {
        f"dept {command} {option}"
        for command, options in found.items()
        for option in options
        if option not in help_text(command)
    }
    assert not missing, sorted(missing)
