"""A resumed run on another device computes differently: refused unless the user allows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dept.config import ConfigError, load_config, to_run_config
from server_app.checkpoint import check_same_run, save_checkpoint
from server_app.resume import resume_overrides
from tests.helpers import debug_run_config


def test_a_device_change_is_refused_with_the_way_to_allow_it(tmp_path: Path) -> None:
    saved = to_run_config(load_config(debug_run_config(tmp_path, device="cuda")))
    moved = load_config(debug_run_config(tmp_path, device="cpu"))
    with pytest.raises(ConfigError, match="'device' is 'cpu', the checkpointed run's 'cuda'") as e:
        check_same_run(moved, saved)
    assert "will not match an uninterrupted one; add -c allow-device-change=true" in str(e.value)
    check_same_run(load_config(debug_run_config(tmp_path, device="cuda")), saved)


def test_allowed_the_device_may_change_but_nothing_else(tmp_path: Path) -> None:
    saved = to_run_config(load_config(debug_run_config(tmp_path, device="cuda")))
    allowed = debug_run_config(tmp_path, device="cpu", **{"allow-device-change": True})
    check_same_run(load_config(allowed), saved)
    with pytest.raises(ConfigError, match="lr differ from the checkpointed run"):
        check_same_run(load_config({**allowed, "lr": 0.5}), saved)


def test_dept_run_resume_passes_a_device_change_to_that_check(tmp_path: Path) -> None:
    """--resume takes device (and allow-device-change) from -c; check_same_run decides."""
    config = debug_run_config(tmp_path, device="cuda")
    out = Path(config["output-dir"])
    save_checkpoint(out, 1, {}, {"run_config": config, "strategy": {}})
    merged = resume_overrides(out, {"device": "cpu"})
    with pytest.raises(ConfigError, match="add -c allow-device-change=true"):
        check_same_run(load_config(merged), config)
