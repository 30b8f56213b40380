"""A round in which no source trained is no round: it is tried again, never checkpointed as
progress, and a run that keeps having them stops with one line naming the cause, resumable."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from flwr.app import Error, Message

from client_app.app import app as client_app
from dept.state.disks import disk_note, no_space
from dept.state.workspace import Workspace
from dept.wire import keys
from server_app.federation import run_federation
from server_app.launch import exit_code
from server_app.local_grid import LocalGrid
from server_app.no_progress import NothingTrained, WorkerDied, nothing_trained
from server_app.run_status import read_status
from tests.conftest import ProjectLog
from tests.helpers import debug_run_config, synthetic_sources

NODES = [{"partition-id": i, "num-partitions": 2} for i in range(2)]


def test_the_line_names_the_round_its_tries_and_the_reasons() -> None:
    reasons = "source a: OSError: [Errno 28] No space left on device (the disk of /s is full)"
    error = nothing_trained(3, 3, reasons, 2)
    assert isinstance(error, NothingTrained)
    assert str(error) == (
        "no source trained in round 3, tried 3 times (config key 'empty-round-retries' is "
        f"2): {reasons}"
    )
    first = str(nothing_trained(1, 1, "source a: ValueError: bad data", 2))
    assert first == (
        "no source trained in round 1 (a setup error: it is not tried again): "
        "source a: ValueError: bad data"
    )


def test_a_full_disk_is_told_with_its_folder_and_free_space(tmp_path: Path) -> None:
    folder = tmp_path / ".tmp-round-0002"
    folder.mkdir()
    assert disk_note(folder / "embeddings.safetensors").startswith(
        f"the disk of {folder} is full ("
    )
    assert disk_note(folder).endswith(" free)")
    assert disk_note(Path("/nowhere/at/all")) == "the disk of /nowhere/at/all is full"
    assert no_space(OSError(errno.ENOSPC, "No space left on device"))
    wrapped = RuntimeError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )
    assert no_space(wrapped) and not no_space(ValueError("bad data"))


def _config(tmp_path: Path, node_cache: Path, **overrides: object) -> dict:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    return debug_run_config(
        tmp_path,
        node_cache,
        **{"sources-file": str(sources), "num-server-rounds": 3, "local-steps": 2, **overrides},
    )


def _fill_state_disk(monkeypatch: pytest.MonkeyPatch, from_round: int, times: float) -> list[int]:
    """Every node's state write fails with ENOSPC from ``from_round`` on, ``times`` times
    (inf: always); the rounds it failed in."""
    failed: list[int] = []
    write = Workspace._write_state

    def full(self: Workspace, server_round: int, state: object, base: int | None) -> None:
        if server_round >= from_round and len(failed) < times:
            failed.append(server_round)
            raise OSError(errno.ENOSPC, "No space left on device", str(self.dir))
        write(self, server_round, state, base)  # type: ignore[arg-type]

    monkeypatch.setattr(Workspace, "_write_state", full)
    return failed


def _rounds(out: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_full_state_folder_stops_the_run_and_the_resume_redoes_the_rounds(
    tmp_path: Path, node_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # Prepare: the nodes' state folder is full from round 2 on
    config = _config(tmp_path, node_cache)
    out = tmp_path / "out"
    failed = _fill_state_disk(monkeypatch, from_round=2, times=float("inf"))
    # Execute
    with pytest.raises(NothingTrained) as stopped:
        run_federation(LocalGrid(client_app, NODES, config), config)
    # Assert: round 2 tried three times, nothing after round 1 kept as progress
    assert failed == [2] * 6, "two sources, the round and its two retries"
    line = str(stopped.value)
    assert line.startswith("no source trained in round 2, tried 3 times")
    assert "No space left on device" in line and f"the disk of {tmp_path / 'state'}" in line
    assert " free)" in line, "the node says its folder and what is free there"
    status = read_status(out, 0)
    assert status is not None and status.state == "failed" and "round 2, tried 3" in status.error
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["round-0000", "round-0001"]
    assert _rounds(out) == [0, 1]
    # what dept run says: the line, and the command that resumes after round 1
    assert exit_code(out, 0, 0) == 1
    said = capsys.readouterr().err
    assert "dept run: error: no source trained in round 2" in said
    assert "resume after round 1 with: dept run --resume" in said
    # Execute: space freed, resumed: the rounds that trained nothing are trained
    monkeypatch.undo()
    resumed = {**config, "resume": True}
    summary = run_federation(LocalGrid(client_app, NODES, resumed), resumed).summary
    assert _rounds(out) == [0, 1, 2, 3]
    assert all(s["tokens_trained"] == 3 * 2 * 4 * 64 for s in summary["sources"].values())


def test_a_round_that_trained_nothing_once_is_tried_again_and_the_run_goes_on(
    tmp_path: Path, node_cache: Path, monkeypatch: pytest.MonkeyPatch, project_log: ProjectLog
) -> None:
    config = _config(tmp_path, node_cache)
    failed = _fill_state_disk(monkeypatch, from_round=2, times=2)  # round 2's first try
    summary = run_federation(LocalGrid(client_app, NODES, config), config).summary
    assert failed == [2, 2]
    assert "round 2 trained nothing" in project_log.text
    assert "trying the round again (1 of 2)" in project_log.text
    out = tmp_path / "out"
    assert _rounds(out) == [0, 1, 2, 3], "one line per round, the retry's"
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines[2]["failed"]) == 2, "the failed try is in its round's line"
    assert all(s["tokens_trained"] == 3 * 2 * 4 * 64 for s in summary["sources"].values())


def test_with_no_retries_the_first_empty_round_stops_the_run(
    tmp_path: Path, node_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path, node_cache, **{"empty-round-retries": 0})
    _fill_state_disk(monkeypatch, from_round=2, times=float("inf"))
    with pytest.raises(NothingTrained, match="round 2, tried 1 times"):
        run_federation(LocalGrid(client_app, NODES, config), config)


RAY_DEATH = (
    "<class 'ray.exceptions.ActorDiedError'>:<'The actor died unexpectedly before finishing "
    "this task.\nThe actor is dead because its worker process has died. Worker exit type: "
    "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code "
    "2. End of file.'>"
)


def _worker_dies(node: int, from_round: int):
    """The client app, but ``node``'s messages from ``from_round`` on fail as Flower's
    simulation answers for a killed Ray worker (it is not replaced)."""

    def app(msg: Message, context) -> Message:
        config = msg.content.config_records.get(keys.CONFIG)
        server_round = config.get(keys.SERVER_ROUND, 0) if config else 0
        if msg.metadata.dst_node_id == node and server_round >= from_round:
            return Message(Error(code=0, reason=RAY_DEATH), reply_to=msg)
        return client_app(msg, context)

    return app


def test_a_dead_simulation_worker_stops_the_run_after_its_round(
    tmp_path: Path, node_cache: Path
) -> None:
    config = _config(tmp_path, node_cache, **{"num-server-rounds": 4})
    with pytest.raises(WorkerDied) as stopped:
        run_federation(LocalGrid(_worker_dies(2, 2), NODES, config), config)
    line = str(stopped.value)
    assert line.startswith("a simulation worker died in round 2 (sources synth-greek could not")
    assert "The actor is dead because its worker process has died" in line
    assert "a resumed run starts with fresh workers" in line
    out = tmp_path / "out"
    assert _rounds(out) == [0, 1, 2], "what trained in round 2 is kept; no round after it"
    resumed = {**config, "resume": True}
    summary = run_federation(LocalGrid(client_app, NODES, resumed), resumed).summary
    assert _rounds(out) == [0, 1, 2, 3, 4]
    assert summary["sources"]["synth-greek"]["tokens_trained"] == 3 * 2 * 4 * 64, "it missed 2"
