"""States written behind the reply (the warm worker): the reply does not wait for the files,
the next load does, and gets the very state kept in memory while it is what the files hold;
a write that fails, or a state a crashed attempt left, is never given."""

import threading
from pathlib import Path

import pytest
import torch

from dept.state.workspace import Attempt, Workspace
from tests.dept.state.test_workspace import _state


@pytest.fixture
def behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Workspace, "write_behind", True)


def _held_writes(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make ``ws``'s writes wait until the returned event is set."""
    go_on, write = threading.Event(), ws._write_state

    def held(server_round: int, state: object, base: int | None) -> None:
        assert go_on.wait(10), "the write was never let go on"
        write(server_round, state, base)  # type: ignore[arg-type]

    monkeypatch.setattr(ws, "_write_state", held)
    return go_on


def _full_disk_in_round(failing: int, ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``ws``'s write of round ``failing``'s state fail as a full disk does."""
    write = ws._write_state

    def full_disk(server_round: int, state: object, base: int | None) -> None:
        if server_round == failing:
            raise OSError(28, "No space left on device")
        write(server_round, state, base)  # type: ignore[arg-type]

    monkeypatch.setattr(ws, "_write_state", full_disk)


@pytest.mark.usefixtures("behind")
def test_saving_returns_before_the_files_and_the_next_load_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = Workspace(tmp_path, "run", "src")
    go_on = _held_writes(ws, monkeypatch)
    state = _state(1)

    ws.save_state(1, state)  # returns at once: the write waits on go_on
    assert not (ws.dir / "round-0001").exists()
    threading.Timer(0.2, go_on.set).start()
    found = ws.load_state(before_round=2, attempt=Attempt("a"))

    assert (ws.dir / "round-0001").is_dir(), "the load waited for the write"
    assert found.state is state, "given from memory, not read back"
    again = Workspace(tmp_path, "run", "src").load_state(before_round=2).state
    assert again is not None and torch.equal(again.embeddings["input"], state.embeddings["input"])


@pytest.mark.usefixtures("behind")
def test_a_consumed_state_is_read_from_the_files_next_time(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, "run", "src")
    ws.save_state(1, _state(1))
    first = ws.load_state(before_round=2, consume=True).state
    assert first is not None
    first.embeddings["input"].add_(100.0)  # training changes it in place

    second = ws.load_state(before_round=2).state

    assert second is not None and second is not first
    assert torch.equal(second.embeddings["input"], torch.full((3, 2), 1.0))


@pytest.mark.usefixtures("behind")
def test_the_kept_state_is_not_given_where_the_files_would_not_give_it(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, "run", "src")
    ws.save_state(2, _state(2, attempt="first"))
    ws.save_state(3, _state(3, attempt="first"))  # the server died before its round 3
    # a re-run of round 3 wants round 2's state; a resumed attempt drops round 3's
    rerun = ws.load_state(before_round=3).state
    resumed = ws.load_state(before_round=4, attempt=Attempt("second", resumed_after=2)).state
    assert rerun is not None and rerun.server_round == 2
    assert resumed is not None and resumed.server_round == 2
    assert not (ws.dir / "round-0003").exists()


# a failed write of round 2 is said where its state was the one wanted (round 3 loads the
# state before it); not where a resumed server runs round 2 again, which never uses it
@pytest.mark.parametrize(
    ("before_round", "attempt", "said"),
    [(3, None, True), (2, Attempt("second", resumed_after=1), False)],
    ids=["the next round", "round 2 run again"],
)
@pytest.mark.usefixtures("behind")
def test_a_failed_write_falls_back_to_the_state_before_and_says_why_where_it_was_wanted(
    before_round: int,
    attempt: Attempt | None,
    said: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws = Workspace(tmp_path, "run", "src")
    ws.save_state(1, _state(1))
    _full_disk_in_round(2, ws, monkeypatch)
    ws.save_state(2, _state(2, attempt="first"))

    found = ws.load_state(before_round=before_round, attempt=attempt)

    assert found.state is not None and found.state.server_round == 1
    assert ["No space left on device" in why for why in found.unusable] == ([True] if said else [])
