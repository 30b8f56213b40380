"""What a run leaves behind: the earlier run kept, every source in the table and summary
(one that never counted too, with why), a complete metrics.csv, files of one mode."""

import csv
import os
from pathlib import Path

from flwr.app import Error, Message, MessageType
from flwr.common.constant import ErrorCode

from client_app.app import app as client_app
from dept.config import load_config
from dept_strategy.history import source_row
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from server_app.report import RunReport, render_table
from tests.helpers import debug_run_config, synthetic_sources

BROKEN = "source synth-greek: ValueError: its data cannot be read"


def test_a_new_run_keeps_the_previous_runs_files(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    out = tmp_path / "out"
    RunReport(out, cfg, "run1")
    (out / "summary.json").write_text('{"earlier": true}')

    RunReport(out, cfg, "run1")

    [archived] = (out / "previous").iterdir()
    assert (archived / "summary.json").read_text() == '{"earlier": true}'
    assert not (out / "summary.json").exists() and (out / "config.json").exists()


def _broken_on(node: int):
    """The real ClientApp, but node ``node`` fails every train and evaluate message (it
    still says which source it serves)."""

    def app(msg: Message, context) -> Message:
        if msg.metadata.dst_node_id == node and msg.metadata.message_type != MessageType.QUERY:
            error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=BROKEN)
            return Message(error, reply_to=msg)
        return client_app(msg, context)

    return app


def test_a_run_reports_every_source_and_node_even_those_that_never_counted(
    tmp_path: Path,
) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    run_config = debug_run_config(
        tmp_path,
        **{"sources-file": str(sources), "num-server-rounds": 1, "min-available-nodes": 3},
    )
    nodes = [
        {"partition-id": 0, "num-partitions": 2},
        {"partition-id": 1, "num-partitions": 2},
        {"source": "lost", "path": str(tmp_path / "no-such-folder")},
    ]
    umask = os.umask(0o027)  # a stricter umask than usual: the outputs follow it
    try:
        result = run_federation(LocalGrid(_broken_on(2), nodes, run_config), run_config)
    finally:
        os.umask(umask)

    out, summary = result.out_dir, result.summary
    greek = summary["sources"]["synth-greek"]
    assert greek["tokens_trained"] == 0 and greek["val_bpb"] is None
    assert greek["last_failure"] == BROKEN
    assert [(p["round"], p["source"]) for p in summary["problems"] if "source" in p] == [
        (0, "synth-greek"),  # the evaluation before training
        (1, "synth-greek"),  # its training; an erring node waits for the next round
    ]
    assert greek["failures"] == 2
    assert summary["sources"]["synth-latin"]["last_failure"] is None
    assert "lost" in summary["unserved_nodes"]["3"]
    table = " ".join(render_table(summary).split())  # as one line: long notes wrap
    assert "│ synth-greek │ – │ – │ – │ 0 │" in table, "its row, without numbers"
    assert (
        f"synth-greek: none of its replies counted (2 failed or refused); last: {BROKEN}" in table
    )
    assert "node 3 (its sources unknown): source lost: ConfigError" in table
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["round", "source", *source_row({}, {})]
    trained = [r for r in rows if r["round"] == "1" and r["source"] == "synth-latin"]
    assert [r["tokens"] for r in trained] == [str(8 * 4 * 64)], "an integer, not 2048.0"
    assert float(trained[0]["tokens_per_s"]) > 0 and int(trained[0]["bytes_up"]) > 0
    assert rows[0]["train_loss"] == "", "round 0 trained nothing: an empty cell"
    files = [p for p in out.rglob("*") if p.is_file() and p.name != ".dept-run.lock"]
    modes = {p.relative_to(out).as_posix(): oct(p.stat().st_mode & 0o777) for p in files}
    assert set(modes.values()) == {"0o640"}, modes
    assert {"body.safetensors", "checkpoints/round-0001/tensors.safetensors"} <= modes.keys()
