"""The rooms of the code (the house style's first habit, docs/layout.md), enforced: which
package may import which.

The core (``dept``) has no Flower and nothing that builds on it; the client app needs the core
only (the message contract lives there), so a node never installs the server's logic to run.
Inside the core the rooms stand in one order, each importing only those before it, and no
module of ours imports itself back through others.
"""

from __future__ import annotations

import ast
import graphlib
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
# The core's rooms, lowest first: a room imports only the rooms before it.
CORE_ROOMS = [
    "paths",  # where state lives
    "wire",  # what travels between server and nodes
    "model",  # families, variants, outer optimizers
    "config",  # the run configuration
    "data",  # a source's text to token streams
    "state",  # what a node keeps on disk
    "train",  # a source's local work
    "cli_help",
    "logs",
    "export",  # a run's models for transformers
    "certificates",
]


# benchmarks/: a folder per question, each importing only itself and the shared modules.
BENCHMARK_SHARED = {"measure", "timed_grid"}


def imported_names(path: Path) -> set[str]:
    """Dotted names of every module ``path`` imports, at any depth of the file (for
    ``from a.b import c``: ``a.b`` and ``a.b.c``, which may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports."""
    return {name.split(".")[0] for name in imported_names(path)}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("package", sorted(ALLOWED_OURS))
def test_a_package_imports_only_the_rooms_below_it(package: str) -> None:
    banned = (OURS - ALLOWED_OURS[package]) | BANNED_LIBRARIES.get(package, set())
    offenders = {
        f"{path.relative_to(ROOT)} imports {', '.join(sorted(found))}"
        for path in sorted((ROOT / package).rglob("*.py"))
        if (found := imported_modules(path) & banned)
    }
    assert not offenders, "; ".join(sorted(offenders))


def test_the_core_s_rooms_import_only_the_rooms_before_them() -> None:
    found = {module_name(path).split(".")[1] for path in (ROOT / "dept").glob("*/__init__.py")}
    found |= {path.stem for path in (ROOT / "dept").glob("*.py")} - {"__init__"}
    assert found == set(CORE_ROOMS), "every room of dept/ stands in CORE_ROOMS, once"
    offenders = []
    for path in sorted((ROOT / "dept").rglob("*.py")):
        own = module_name(path).split(".")
        if len(own) < 2:
            continue
        allowed = set(CORE_ROOMS[: CORE_ROOMS.index(own[1]) + 1])
        used = {name.split(".")[1] for name in imported_names(path) if name.startswith("dept.")}
        offenders += [f"{path.relative_to(ROOT)} imports dept.{room}" for room in used - allowed]
    assert not offenders, "; ".join(offenders)


def test_a_benchmark_group_imports_only_itself_and_the_shared_modules() -> None:
    groups = {p.parent.name for p in (ROOT / "benchmarks").glob("*/__init__.py")}
    assert groups >= {"soak", "comparison", "overhead", "gpu"}, groups
    for group in groups:
        assert (ROOT / "benchmarks" / group / "README.md").is_file(), f"{group} has no README"
    offenders = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        own = module_name(path).split(".")
        allowed = BENCHMARK_SHARED | ({own[1]} if len(own) > 2 else groups)
        used = {n.split(".")[1] for n in imported_names(path) if n.startswith("benchmarks.")}
        offenders += [f"{path.relative_to(ROOT)} imports benchmarks.{g}" for g in used - allowed]
    assert not offenders, "; ".join(offenders)


def test_no_module_imports_itself_back_through_others() -> None:
    modules = {module_name(path): path for pkg in OURS for path in (ROOT / pkg).rglob("*.py")}
    graph = {
        name: {used for used in imported_names(path) if used in modules and used != name}
        for name, path in modules.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail("a module imports itself back: " + " -> ".join(reversed(error.args[1])))


def test_the_check_sees_a_late_import(tmp_path: Path) -> None:
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from flwr.app import Message\n    import server_app.x\n")
    assert imported_modules(module) == {"flwr", "server_app"}
