"""A worker or server killed while it writes a round's state or checkpoint leaves that
round's folder under its temporary name; the next round written removes it, and leaves a
later round's alone (a writer of this folder may still be at it)."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dept.state.workspace import Workspace
from server_app.checkpoint import CHECKPOINTS, save_checkpoint
from tests.dept.state.test_workspace import _state


def _source_state(root: Path, server_round: int) -> Path:
    workspace = Workspace(root, "run", "src")
    workspace.save_state(server_round, _state(server_round))
    return workspace.dir


def _checkpoint(root: Path, server_round: int) -> Path:
    save_checkpoint(root, server_round, {"w": torch.zeros(2)}, {})
    return root / CHECKPOINTS


@pytest.mark.parametrize("write", [_source_state, _checkpoint], ids=["state", "checkpoint"])
def test_what_a_killed_write_left_goes_with_the_next_round_written(
    write: Callable[[Path, int], Path], tmp_path: Path
) -> None:
    folder = write(tmp_path, 1)
    for name in (".tmp-round-0002", ".old-round-0001", ".tmp-round-0004"):
        (folder / name).mkdir()
        (folder / name / "embeddings.safetensors").write_bytes(b"half written")

    write(tmp_path, 3)

    hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert hidden == [".tmp-round-0004"]
