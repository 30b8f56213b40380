"""A source state damaged in place, its size and header intact, is passed over: the fault
soak found such a state loaded as if good (safetensors checks its header, not its data)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dept.data.token_stream import StreamPosition
from dept.state.workspace import (
    EMBEDDINGS_FILE,
    OPTIMIZER_FILE,
    PROGRESS_FILE,
    RESIDUAL_FILE,
    SourceState,
    Workspace,
)


def _state(server_round: int) -> SourceState:
    weights = torch.full((64, 8), float(server_round))
    return SourceState(
        server_round,
        {"input": weights},
        {"state": {0: {"exp_avg": weights.clone()}}, "param_groups": []},
        StreamPosition(0, server_round),
        "tok",
        residual={"model.norm.weight": weights[0].clone()},
    )


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", [EMBEDDINGS_FILE, OPTIMIZER_FILE, RESIDUAL_FILE])
def test_a_state_file_changed_in_place_sends_the_source_to_the_state_before(
    tmp_path: Path, name: str
) -> None:
    ws = Workspace(tmp_path, "run", "src")
    for server_round in (1, 2):
        ws.save_state(server_round, _state(server_round))

    _flip_middle(ws.dir / "round-0002" / name)
    found = ws.load_state(before_round=3)

    assert found.state is not None and found.state.server_round == 1
    assert len(found.unusable) == 1 and "does not match its SHA-256" in found.unusable[0]
    assert name in found.unusable[0]


def test_a_state_saved_before_digests_were_kept_still_loads(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, "run", "src")
    ws.save_state(1, replace(_state(1), residual={}))
    progress_path = ws.dir / "round-0001" / PROGRESS_FILE
    progress = json.loads(progress_path.read_text())
    assert set(progress.pop("sha256")) == {EMBEDDINGS_FILE, OPTIMIZER_FILE}
    progress_path.write_text(json.dumps(progress))

    found = ws.load_state(before_round=2)

    assert found.state is not None and found.state.server_round == 1 and not found.unusable
