"""What a finished run leaves and records: each source's fresh starts in ``summary.json``
(with their round, as its node reported them), and no temporary spool folder."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from flwr.app import Message, MessageType

from client_app.app import app as client_app
from dept import keys
from server_app.federation import SPOOL_DIR, run_federation
from server_app.local_grid import LocalGrid
from tests.helpers import debug_run_config, synthetic_sources

LOST = "synth-greek"


class StateLosingGrid(LocalGrid):
    """Deletes every saved state of :data:`LOST` before its round-3 training arrives."""

    def __init__(self, *args, state: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.state = state

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        for msg in messages:
            config = msg.content.config_records[keys.CONFIG]
            ours = config.get(keys.SOURCE) == LOST and config.get(keys.SERVER_ROUND) == 3
            if msg.metadata.message_type == MessageType.TRAIN and ours:
                for folder in self.state.rglob(f"runs/*/{LOST}/round-*"):
                    shutil.rmtree(folder)
        return super().push_messages(messages)


def test_a_lost_state_is_a_fresh_start_in_the_summary_and_no_spool_is_left(
    tmp_path: Path, node_cache: Path
) -> None:
    # Prepare
    sources = synthetic_sources(tmp_path, "latin", "greek")
    config = debug_run_config(
        tmp_path,
        node_cache,
        **{"sources-file": str(sources), "num-server-rounds": 3, "local-steps": 2},
    )
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    grid = StateLosingGrid(client_app, nodes, config, state=Path(config["state-dir"]))

    # Execute
    result = run_federation(grid, config)

    # Assert
    starts = result.summary["sources"][LOST]["fresh_starts"]
    assert [s["round"] for s in starts] == [3], starts
    assert starts[0]["event"].startswith("fresh embeddings in round 3: state lost")
    assert result.summary["sources"]["synth-latin"]["fresh_starts"] == []
    assert not (result.out_dir / SPOOL_DIR).exists(), "the finished run left its spool"
