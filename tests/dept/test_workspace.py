"""A source's per-round state: kept, pruned, and dropped when a crashed attempt left it."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dept.data import StreamPosition
from dept.workspace import KEEP_ROUNDS, RESIDUAL_FILE, Attempt, SourceState, Workspace


def _state(server_round: int, attempt: str = "a") -> SourceState:
    return SourceState(
        server_round,
        {"input": torch.full((3, 2), float(server_round))},
        {"state": {}, "param_groups": []},
        StreamPosition(0, server_round),
        "tok",
        attempt,
    )


def test_the_newest_state_before_a_round_is_loaded_and_old_ones_are_pruned(
    tmp_path: Path,
) -> None:
    ws = Workspace(tmp_path, "run", "src")
    for server_round in range(1, 7):
        ws.save_state(server_round, _state(server_round))
    assert len(list(ws.dir.glob("round-*"))) == KEEP_ROUNDS
    state = ws.load_state(before_round=5)
    assert state is not None and state.server_round == 4 and state.position.offset == 4
    assert torch.equal(state.embeddings["input"], torch.full((3, 2), 4.0))
    with pytest.raises(FileNotFoundError, match="was pruned"):
        ws.load_state(before_round=3)
    assert Workspace(tmp_path, "run", "other").load_state(before_round=9) is None


def test_state_a_crashed_attempt_left_beyond_the_resume_point_is_dropped(
    tmp_path: Path,
) -> None:
    ws = Workspace(tmp_path, "run", "src")
    ws.save_state(2, _state(2, attempt="first"))
    ws.save_state(3, _state(3, attempt="first"))  # trained, but the server died before round 3
    second = Attempt("second", resumed_after=2)
    assert ws.load_state(before_round=4) is not None, "reading without an attempt drops nothing"
    resumed = ws.load_state(before_round=4, attempt=second)
    assert resumed is not None and resumed.server_round == 2
    assert not (ws.dir / "round-0003").exists()
    ws.save_state(3, _state(3, attempt="second"))  # the re-run of round 3
    again = ws.load_state(before_round=4, attempt=second)
    assert again is not None and again.server_round == 3 and again.attempt == "second"


def test_a_residual_is_kept_with_its_round_and_absent_without_one(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, "run", "src")
    residual = {"model.norm.weight": torch.linspace(-1, 1, 5)}
    ws.save_state(1, _state(1))
    ws.save_state(2, replace(_state(2), residual=residual))
    assert (ws.dir / "round-0002" / RESIDUAL_FILE).is_file()
    restarted = Workspace(tmp_path, "run", "src").load_state(before_round=3)  # a new process
    assert restarted is not None
    assert torch.equal(restarted.residual["model.norm.weight"], residual["model.norm.weight"])
    before = ws.load_state(before_round=2)
    assert before is not None and before.residual == {}
