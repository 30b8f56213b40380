"""A source's round state records the device it trained on; a state from another kind of
device goes on only where the run allows it (its numbers would differ)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dept.config import load_config
from dept.data.sources import load_sources
from dept.model.build import build_model
from dept.model.roles import body_state
from dept.state.workspace import PROGRESS_FILE, Workspace
from dept.train.source_client import SourceClient
from tests.helpers import debug_run_config


def _client(tmp_path: Path, **overrides: object) -> SourceClient:
    cfg = load_config(debug_run_config(tmp_path, **{"local-steps": 2, **overrides}))
    spec = next(s for s in load_sources(None) if s.name == "synth-greek")
    return SourceClient(cfg, spec, Workspace(tmp_path / "state", "run1", spec.name))


def _trained_on(client: SourceClient, server_round: int, device: str) -> None:
    """Make the saved state of ``server_round`` say it trained on ``device``."""
    progress = next(client.ws.dir.glob(f"*{server_round:04d}*")) / PROGRESS_FILE
    saved = json.loads(progress.read_text())
    assert saved["device"] == "cpu"
    progress.write_text(json.dumps({**saved, "device": device}))


def test_a_state_from_another_device_is_refused_unless_allowed(tmp_path: Path) -> None:
    client = _client(tmp_path)
    body = body_state(build_model("debug", 300, 64, seed=0))
    client.train_round(body, global_step=0, server_round=1)
    _trained_on(client, 1, "cuda")
    with pytest.raises(
        ValueError, match="round 1 was trained on cuda, and this node trains on cpu"
    ):
        client.train_round(body, global_step=2, server_round=2)
    allowed = _client(tmp_path, **{"allow-device-change": True})
    allowed.train_round(body, global_step=2, server_round=2)


def test_a_state_from_before_devices_were_recorded_goes_on(tmp_path: Path) -> None:
    client = _client(tmp_path)
    body = body_state(build_model("debug", 300, 64, seed=0))
    client.train_round(body, global_step=0, server_round=1)
    progress = next(client.ws.dir.glob("*0001*")) / PROGRESS_FILE
    saved = json.loads(progress.read_text())
    del saved["device"]
    progress.write_text(json.dumps(saved))
    client.train_round(body, global_step=2, server_round=2)
