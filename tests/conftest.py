"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from dept.config import DeptConfig, load_config
from tests.helpers import debug_run_config


@pytest.fixture
def debug_config(tmp_path: Path) -> DeptConfig:
    return load_config(debug_run_config(tmp_path))
