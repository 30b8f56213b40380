"""Real full disks (a tmpfs filled after round 1): the nodes' state folder, and the run's own
output folder. The run stops with one line naming the disk, keeps every line it wrote whole,
and resumes once there is space, redoing the rounds that trained nothing."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message, MessageType

from benchmarks.soak.faults import fill
from client_app.app import app as client_app
from dept.state.jsonl import read_lines
from dept.wire import keys
from dept_strategy.spool import RoundSpool
from server_app.checkpoint import load_latest
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from server_app.no_progress import NothingTrained, ServerDiskFull
from server_app.run_status import read_status
from tests.helpers import debug_run_config, share_cache, small_disk, synthetic_sources

NODES = [{"partition-id": i, "num-partitions": 2} for i in range(2)]


class FillingGrid(LocalGrid):
    """Fills the disk of ``folder`` just before round ``at``'s training is sent."""

    def __init__(self, *args, folder: Path, at: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.folder, self.at, self.filler = folder, at, None

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        for msg in messages:
            config = msg.content.config_records.get(keys.CONFIG)
            round_ = config.get(keys.SERVER_ROUND) if config else None
            if msg.metadata.message_type == MessageType.TRAIN and round_ == self.at:
                self.filler = self.filler or fill(self.folder)
        return super().push_messages(messages)


def _config(tmp_path: Path, **paths: str) -> dict:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    return debug_run_config(
        tmp_path,
        **{"sources-file": str(sources), "num-server-rounds": 3, "local-steps": 2, **paths},
    )


def _resume_after_freeing(config: dict, filler: Path) -> list[int]:
    filler.unlink()
    resumed = {**config, "resume": True}
    out = Path(config["output-dir"])
    run_federation(LocalGrid(client_app, NODES, resumed), resumed)
    return [line["round"] for line in read_lines(out / "metrics.jsonl")]


def test_a_full_state_folder_names_its_disk_and_the_run_resumes(
    tmp_path: Path, node_cache: Path
) -> None:
    with small_disk(tmp_path / "state") as state:
        share_cache(state, node_cache)  # the caches stay off the small disk
        config = _config(tmp_path, **{"state-dir": str(state)})
        grid = FillingGrid(client_app, NODES, config, folder=state, at=2)
        with pytest.raises(NothingTrained) as stopped:
            run_federation(grid, config)
        line = str(stopped.value)
        assert line.startswith("no source trained in round 2, tried 3 times")
        assert f"the disk of {state}" in line and "B free)" in line
        out = Path(config["output-dir"])
        assert [r["round"] for r in read_lines(out / "metrics.jsonl")] == [0, 1]
        assert _resume_after_freeing(config, grid.filler) == [0, 1, 2, 3]


def test_a_full_output_folder_names_its_disk_keeps_whole_lines_and_resumes(
    tmp_path: Path, node_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_disk(tmp_path / "out") as out:
        config = _config(tmp_path, **{"output-dir": str(out)})
        share_cache(Path(config["state-dir"]), node_cache)
        grid = FillingGrid(client_app, NODES, config, folder=out, at=2)
        with pytest.raises(ServerDiskFull) as stopped:
            run_federation(grid, config)
        line = str(stopped.value)
        assert line.startswith("round 2: the server could not keep it on disk, the reply of ")
        assert f"the disk of {out}" in line and line.endswith("once there is space")
        lines = read_lines(out / "metrics.jsonl")
        assert "torn" not in caplog.text, "every line whole"
        assert [r["round"] for r in lines] == [0, 1]
        status = read_status(out, 0)  # written if the few bytes it needs were there
        assert status is None or status.state == "failed"
        latest = load_latest(out)
        assert latest is not None and latest.server_round == 1, "it verifies"
        assert _resume_after_freeing(config, grid.filler) == [0, 1, 2, 3]


def test_a_round_whose_reply_did_not_fit_the_servers_disk_is_not_kept(
    tmp_path: Path, node_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the disk nearly full: one of round 2's replies fits, the other does not. The round
    # would stand on whichever fitted (a long soak trained 34 rounds so); it is not kept.
    config = _config(tmp_path)
    share_cache(Path(config["state-dir"]), node_cache)
    write, writes = RoundSpool.write, []

    def nearly_full(self: RoundSpool, tensors: Iterable[tuple[str, np.ndarray]]):
        writes.append(self.folder)
        if len(writes) == 4:  # round 1's two replies, then round 2's second
            raise OSError(errno.ENOSPC, "No space left on device", str(self.folder))
        return write(self, tensors)

    monkeypatch.setattr(RoundSpool, "write", nearly_full)
    with pytest.raises(ServerDiskFull, match=r"^round 2: the server could not keep it on disk"):
        run_federation(LocalGrid(client_app, NODES, config), config)
    out = Path(config["output-dir"])
    assert [r["round"] for r in read_lines(out / "metrics.jsonl")] == [0, 1]
    latest = load_latest(out)
    assert latest is not None and latest.server_round == 1

    monkeypatch.setattr(RoundSpool, "write", write)
    resumed = {**config, "resume": True}
    run_federation(LocalGrid(client_app, NODES, resumed), resumed)
    assert [r["round"] for r in read_lines(out / "metrics.jsonl")] == [0, 1, 2, 3]
