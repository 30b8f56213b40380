"""Every place a benchmark module names on import is there: a module moved one folder down
once pointed ``flwr run`` at ``benchmarks/`` and its results into a folder of its own."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from benchmarks.measure import PROJECT

MODULES = sorted(
    ".".join(path.relative_to(PROJECT).with_suffix("").parts)
    for path in (PROJECT / "benchmarks").rglob("*.py")
    if "results" not in path.parts and path.name != "__init__.py"
)


def test_the_project_is_the_checkout() -> None:
    assert (PROJECT / "pyproject.toml").is_file()
    assert len(MODULES) > 20, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_every_path_a_benchmark_names_exists(name: str) -> None:
    module = importlib.import_module(name)
    named = {k: v for k, v in vars(module).items() if isinstance(v, Path) and v.is_absolute()}
    missing = {k: str(v) for k, v in named.items() if not v.exists()}
    assert not missing, missing
    for key in named.keys() & {"PROJECT", "ROOT"}:
        assert (named[key] / "pyproject.toml").is_file(), f"{key} is not the checkout"
