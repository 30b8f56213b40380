"""What a run leaves behind: the earlier run kept, every source in the table and summary
(one that never counted too, with why), a complete metrics.csv, files of one mode."""

import csv
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Error, Message, MessageType
from flwr.common.constant import ErrorCode

from client_app.app import app as client_app
from dept.config import load_config
from dept.state.jsonl import read_lines
from dept.state.strict_json import dumps
from dept.train import source_client
from dept.wire import keys
from dept_strategy.history import RunHistory, source_row
from server_app.diagnostics import plot_diagnostics
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from server_app.report import RunReport, build_summary, render_table
from tests.conftest import ProjectLog
from tests.dept_strategy.mock_replies import mock_strategy, train_reply
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


def _count_evaluations(monkeypatch) -> list[int]:
    """Every validation scoring a source does, counted (one entry each)."""
    calls: list[int] = []
    score = source_client.evaluate_stream

    def counted(*args, **kwargs):
        calls.append(1)
        return score(*args, **kwargs)

    monkeypatch.setattr(source_client, "evaluate_stream", counted)
    return calls


def _diagnosed_run(tmp_path: Path, **overrides) -> tuple[Path, dict]:
    sources = synthetic_sources(tmp_path, "latin", "greek", "cyrillic")
    run_config = debug_run_config(
        tmp_path, **{"sources-file": str(sources), "variant": "trim", **overrides}
    )
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    result = run_federation(LocalGrid(client_app, nodes, run_config), run_config)
    return result.out_dir, result.summary


def test_metrics_carry_drift_norms_and_interference(tmp_path: Path, monkeypatch) -> None:
    # Prepare
    calls = _count_evaluations(monkeypatch)
    # Execute: 2 rounds of 3 sources, each evaluated before, after round 1 and after round 2
    out, summary = _diagnosed_run(tmp_path, **{"drift-eval": True})
    # Assert
    assert len(calls) == 3 * 3 + 2 * 3, "one more scoring per trained source and round"
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    names = ["synth-cyrillic", "synth-greek", "synth-latin"]
    for line in lines[1:]:
        assert sorted(line["drift"]) == names
        for d in line["drift"].values():
            assert d["drift"] == pytest.approx(d["after"] - d["before"])
            assert 0 < d["before"] < 20
        assert sorted(line["update_norms"]) == names
        assert all(n["theta"] > 0 and n["phi"] > 0 for n in line["update_norms"].values())
        inter = line["interference"]
        assert inter["sources"] == names, "in name order, alike every round"
        for group in ("theta", "phi"):
            matrix = np.array(inter[group], dtype=float)
            assert matrix.shape == (3, 3)
            np.testing.assert_allclose(np.diag(matrix), 1.0, atol=1e-6)
            np.testing.assert_allclose(matrix, matrix.T, atol=1e-9)
            assert -1 <= inter[f"{group}_mean_offdiag"] <= 1
    assert "drift" not in lines[0] and lines[0]["interference"] == {}, "round 0 trains nothing"
    diag = summary["diagnostics"]
    assert -1 <= diag["mean_offdiag_cosine"]["theta"] <= 1
    assert diag["mean_drift"] == pytest.approx(
        diag["mean_averaged_val_bpb"] - diag["mean_local_val_bpb"]
    )
    assert json.loads((out / "summary.json").read_text())["diagnostics"]["mean_drift"] is not None
    assert (out / "drift.png").stat().st_size > 0
    assert (out / "interference.png").stat().st_size > 0


def test_drift_eval_off_writes_no_drift_and_scores_nothing_more(
    tmp_path: Path, monkeypatch
) -> None:
    calls = _count_evaluations(monkeypatch)
    out, summary = _diagnosed_run(tmp_path, interference=False, variant="spec")
    assert len(calls) == 3 * 3, "only the evaluations of rounds 0, 1 and 2"
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("drift" not in line and line["interference"] == {} for line in lines)
    assert all(set(n) == {"theta"} for n in lines[1]["update_norms"].values()), "spec: θ only"
    assert summary["diagnostics"]["mean_drift"] is None
    assert not (out / "drift.png").exists() and not (out / "interference.png").exists()


def test_a_round_without_evaluation_logs_its_training_loss_not_nan(
    tmp_path: Path, project_log: ProjectLog
) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    run_config = debug_run_config(
        tmp_path, **{"sources-file": str(sources), "num-server-rounds": 3, "fraction-evaluate": 0.0}
    )
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    run_federation(LocalGrid(client_app, nodes, run_config), run_config)
    done = [r.getMessage() for r in project_log.records if " done: " in r.getMessage()]
    assert len(done) == 4 and not any("nan" in line for line in done), done
    assert "avg val bpb" in done[0] and "avg val bpb" in done[3], "before and after the run"
    assert "avg train loss" in done[1] and "synth-latin" in done[1]


def _evaluated(history: RunHistory, server_round: int, scores: dict[str, float]) -> None:
    for source, bpb in scores.items():
        history.record_eval(server_round, source, {keys.VAL_BPB: bpb})


def test_an_average_over_other_sources_says_so_and_a_join_is_not_a_regression(
    tmp_path: Path, project_log: ProjectLog
) -> None:
    # Prepare: two sources from the start; georgian joins in round 2 (no round-0 figure)
    cfg = load_config(debug_run_config(tmp_path, **{"num-server-rounds": 2}))
    history = RunHistory(10, cfg.local_steps)
    _evaluated(history, 0, {"latin": 3.0, "greek": 3.2})
    _evaluated(history, 1, {"latin": 2.4, "greek": 2.1})
    for source in ("latin", "greek", "georgian"):
        history.record_train(2, source, {keys.NUM_EXAMPLES: 8, keys.TRAIN_LOSS: 2.0}, 10)
    _evaluated(history, 2, {"latin": 2.2, "greek": 1.9, "georgian": 3.4})
    report = RunReport(tmp_path / "out", cfg, "run1")
    # Execute
    for server_round in (0, 1, 2):
        history.round_ended(server_round, float(server_round))
        report.round_done(history, server_round)
    summary = build_summary(history, cfg, 2.0)
    table = render_table(summary)
    # Assert: each round's line names how many sources its average covers, and the join
    [line] = [r.getMessage() for r in project_log.records if "round 2/2 done" in r.getMessage()]
    assert (
        "over 3 source(s) (georgian joined: not comparable with the last average, over 2)" in line
    )
    assert "round 1/2 done: avg val bpb 2.2500 over 2 source(s) [" in project_log.text
    metrics = read_lines(tmp_path / "out" / "metrics.jsonl")
    assert metrics[2]["avg_val_bpb_sources"] == ["georgian", "greek", "latin"]
    # the summary's averages are over the sources measured before and after, and say which
    assert summary["avg_val_bpb_sources"] == ["greek", "latin"]
    assert summary["avg_val_bpb"] == pytest.approx((2.2 + 1.9) / 2)
    assert "average (2 of 3)" in table
    said = " ".join(table.split())  # the note wraps at the console's width
    assert "left out: georgian (joined in round 2: no figure before training)" in said


def test_a_reply_whose_training_loss_is_nan_is_refused_and_named() -> None:
    strategy = mock_strategy()
    body = {"a": np.full((2, 3), 1e-3, np.float32), "b": np.full(4, 1e-3, np.float32)}
    good = train_reply(strategy, 1, body, 100, "a")
    nan = train_reply(strategy, 2, body, 100, "b")
    nan.content.metric_records[keys.METRICS][keys.TRAIN_LOSS] = float("nan")
    assert strategy.aggregate_train(1, [good, nan])[0] is not None
    [rejected] = strategy.history.rounds[1].rejected
    assert (
        rejected["source"] == "b" and "'train-loss' must be a finite number" in rejected["reason"]
    )
    assert [(p["kind"], p["source"]) for p in strategy.history.problems()] == [("rejected", "b")]


def test_a_round_back_from_a_checkpoint_plots_its_missing_cosines_blank(tmp_path: Path) -> None:
    """A checkpoint holds the history as strict JSON (NaN as null): the resumed run's
    interference plot must take a null cosine as NaN, not fail at the end of the run."""
    history = RunHistory(body_params=10, local_steps=2)
    history.at(1).interference = {
        "sources": ["a", "b"],
        "theta": [[1.0, math.nan], [math.nan, 1.0]],
        "theta_mean_offdiag": math.nan,
    }
    state = json.loads(dumps(history.state_dict()))
    assert state["rounds"][0]["interference"]["theta"][0][1] is None

    restored = RunHistory.from_state_dict(state, local_steps=2)
    written = plot_diagnostics(restored, tmp_path, "resumed")

    assert written == [tmp_path / "interference.png"] and written[0].stat().st_size > 0
