"""The rooms of the code (``../STYLE.md`` habit 1), enforced: which package may import which.

The core (``dept``) has no Flower and nothing that builds on it; the client app needs the core
only (the message contract lives there), so a node never installs the server's logic to run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"dept", "dept_strategy", "server_app", "client_app", "dept_cli", "benchmarks", "tests"}
# package -> the top-level modules it must never import (of ours: all but those listed).
ALLOWED_OURS = {
    "dept": {"dept"},
    "dept_strategy": {"dept", "dept_strategy"},
    "client_app": {"dept", "client_app"},
    "server_app": {"dept", "dept_strategy", "server_app", "client_app"},
    "dept_cli": {"dept", "dept_strategy", "server_app", "client_app", "dept_cli"},
}
BANNED_LIBRARIES = {"dept": {"flwr"}}


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at any depth of the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED_OURS))
def test_a_package_imports_only_the_rooms_below_it(package: str) -> None:
    banned = (OURS - ALLOWED_OURS[package]) | BANNED_LIBRARIES.get(package, set())
    offenders = {
        f"{path.relative_to(ROOT)} imports {', '.join(sorted(found))}"
        for path in sorted((ROOT / package).rglob("*.py"))
        if (found := imported_modules(path) & banned)
    }
    assert not offenders, "; ".join(sorted(offenders))


def test_the_check_sees_a_late_import(tmp_path: Path) -> None:
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from flwr.app import Message\n    import server_app.x\n")
    assert imported_modules(module) == {"flwr", "server_app"}
