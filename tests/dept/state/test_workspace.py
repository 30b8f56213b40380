"""A source's per-round state: kept, pruned, and dropped when a crashed attempt left it."""

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dept.data.token_stream import StreamPosition
from dept.state.workspace import (
    EMBEDDINGS_FILE,
    KEEP_ROUNDS,
    OPTIMIZER_FILE,
    PROGRESS_FILE,
    RESIDUAL_FILE,
    Attempt,
    SourceState,
    Workspace,
)


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
    state = ws.load_state(before_round=5).state
    assert state is not None and state.server_round == 4 and state.position.offset == 4
    assert torch.equal(state.embeddings["input"], torch.full((3, 2), 4.0))
    pruned = ws.load_state(before_round=3)
    assert pruned.state is None and pruned.unusable == ("the states up to round 2 were pruned",)
    assert Workspace(tmp_path, "run", "other").load_state(before_round=9).state is None


def test_the_state_a_round_started_from_outlives_refused_rounds_past_the_kept_few(
    tmp_path: Path,
) -> None:
    # the server took round 21 and then refused every reply (its disk full): each round
    # starts from 21's state again, and that state is kept however many rounds go by
    ws = Workspace(tmp_path, "run", "src")
    ws.save_state(21, _state(21), base=20)
    for server_round in range(22, 22 + KEEP_ROUNDS + 2):
        ws.save_state(server_round, _state(server_round), base=21)

    kept = ws.load_state(before_round=22).state
    assert kept is not None and kept.server_round == 21
    assert len(list(ws.dir.glob("round-*"))) == KEEP_ROUNDS + 1


def test_state_a_crashed_attempt_left_beyond_the_resume_point_is_dropped(
    tmp_path: Path,
) -> None:
    ws = Workspace(tmp_path, "run", "src")
    ws.save_state(2, _state(2, attempt="first"))
    ws.save_state(3, _state(3, attempt="first"))  # trained, but the server died before round 3
    second = Attempt("second", resumed_after=2)
    unfiltered = ws.load_state(before_round=4).state
    assert unfiltered is not None and unfiltered.server_round == 3, "no attempt: nothing dropped"
    resumed = ws.load_state(before_round=4, attempt=second).state
    assert resumed is not None and resumed.server_round == 2
    assert not (ws.dir / "round-0003").exists()
    ws.save_state(3, _state(3, attempt="second"))  # the re-run of round 3
    again = ws.load_state(before_round=4, attempt=second).state
    assert again is not None and again.server_round == 3 and again.attempt == "second"


def test_a_residual_is_kept_with_its_round_and_absent_without_one(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, "run", "src")
    residual = {"model.norm.weight": torch.linspace(-1, 1, 5)}
    ws.save_state(1, _state(1))
    ws.save_state(2, replace(_state(2), residual=residual))
    assert (ws.dir / "round-0002" / RESIDUAL_FILE).is_file()
    restarted = Workspace(tmp_path, "run", "src").load_state(before_round=3).state  # new process
    assert restarted is not None
    assert torch.equal(restarted.residual["model.norm.weight"], residual["model.norm.weight"])
    before = ws.load_state(before_round=2).state
    assert before is not None and before.residual == {}


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncated progress", "JSONDecodeError"),
        ("truncated embeddings", "does not match its SHA-256"),
        ("truncated optimizer", "round 3: "),
        ("embeddings deleted", "embeddings.safetensors is missing"),
        ("optimizer deleted", "optimizer.pt is missing"),
    ],
)
def test_a_damaged_newest_state_falls_back_to_the_newest_good_one(
    tmp_path: Path, damage: str, reason: str
) -> None:
    ws = Workspace(tmp_path, "run", "src")
    for server_round in (1, 2, 3):
        ws.save_state(server_round, _state(server_round))
    newest = ws.dir / "round-0003"
    name = {
        "truncated progress": PROGRESS_FILE,
        "truncated embeddings": EMBEDDINGS_FILE,
        "truncated optimizer": OPTIMIZER_FILE,
        "embeddings deleted": EMBEDDINGS_FILE,
        "optimizer deleted": OPTIMIZER_FILE,
    }[damage]
    if damage.endswith("deleted"):
        (newest / name).unlink()
    else:
        (newest / name).write_bytes((newest / name).read_bytes()[:10])
    found = ws.load_state(before_round=4, required=(EMBEDDINGS_FILE, OPTIMIZER_FILE))
    assert found.state is not None and found.state.server_round == 2
    assert len(found.unusable) == 1 and found.unusable[0].startswith("round 3: ")
    assert reason in found.unusable[0]


def test_a_stray_folder_is_not_a_round(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, "run", "src")
    ws.save_state(1, _state(1))
    (ws.dir / "round-0001.bak").mkdir()
    (ws.dir / "round-notes").mkdir()
    found = ws.load_state(before_round=2)
    assert found.state is not None and found.state.server_round == 1 and not found.unusable
    ws.save_state(2, _state(2))  # pruning too passes over them
    assert (ws.dir / "round-0001.bak").is_dir()


def test_a_saved_state_has_the_mode_the_umask_gives_any_new_file(tmp_path: Path) -> None:
    umask = os.umask(0o027)  # safetensors alone would write its file 0600
    try:
        Workspace(tmp_path, "run", "src").save_state(1, _state(1))
    finally:
        os.umask(umask)
    folder = Workspace(tmp_path, "run", "src").dir / "round-0001"
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes == dict.fromkeys((EMBEDDINGS_FILE, OPTIMIZER_FILE, PROGRESS_FILE), 0o640)
