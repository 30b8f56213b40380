"""Shared fixtures."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dept.config import DeptConfig, load_config
from dept.logs import PROJECT_LOGGERS
from tests.helpers import debug_run_config, held_elsewhere


@pytest.fixture(autouse=True)
def _one_torch_thread() -> None:
    """Every test starts with one torch thread, whatever ran before it (``dept compare`` sets
    the cores' count): the models here are tiny, and with more threads than free cores each
    step waits on spinning threads (forward passes up to 20x slower measured on 2 busy cores)."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def node_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One node cache for the whole session (:func:`tests.helpers.share_cache`)."""
    return tmp_path_factory.mktemp("node-cache")


@pytest.fixture
def debug_config(tmp_path: Path) -> DeptConfig:
    return load_config(debug_run_config(tmp_path))


@pytest.fixture
def project_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` that sees the project's records even after an app routed them to
    Flower's handlers (:func:`dept.logs.route_to` stops their propagation to the root)."""
    loggers = [logging.getLogger(name) for name in PROJECT_LOGGERS]
    for logger in loggers:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    try:
        yield caplog
    finally:
        for logger in loggers:
            logger.removeHandler(caplog.handler)


@pytest.fixture
def held_output(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """An output folder another living process holds, and that process's pid."""
    with held_elsewhere(tmp_path / "out") as pid:
        yield tmp_path / "out", pid
