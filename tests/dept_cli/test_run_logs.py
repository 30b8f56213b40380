"""A comparison run's log lines: each labelled with its run, all in its run.log, then undone."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from dept.config import DeptConfig, to_run_config
from dept.logs import PROJECT_LOGGERS
from dept_cli import compare
from dept_cli.run_logs import run_logging

LABEL = "[spec-opt lr 0.01] "


def test_every_line_of_a_run_is_labelled_and_kept_in_its_file(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    factory = logging.getLogRecordFactory()
    flwr, console = logging.getLogger("flwr"), io.StringIO()
    terminal = logging.StreamHandler(console)  # stands for Flower's console handler
    flwr.addHandler(terminal)

    try:
        with run_logging("spec-opt lr 0.01", path):
            logging.getLogger("dept.train.local").info("step %d of %s", 3, "100%")
            flwr.info("a table\nof two lines")
            try:
                raise FloatingPointError("loss became nan")
            except FloatingPointError:
                logging.getLogger("dept_cli.compare").exception("crashed")
        logging.getLogger("dept.train.local").info("after the run")
    finally:
        flwr.removeHandler(terminal)
        for name in PROJECT_LOGGERS:  # route_to gave them Flower's handlers
            logging.getLogger(name).removeHandler(terminal)

    lines = path.read_text().splitlines()
    starts = [line for line in lines if line.startswith("20")]  # a record's first line
    assert [line.split(" ", 3)[2:] for line in starts] == [
        ["dept.train.local", LABEL + "step 3 of 100%"],
        ["flwr", LABEL + "a table"],
        ["dept_cli.compare", LABEL + "crashed"],
    ]
    assert all(LABEL in line for line in lines), "continuation and traceback lines too"
    assert LABEL + "FloatingPointError: loss became nan" in lines
    shown = console.getvalue().splitlines()
    assert shown[:4] == [
        LABEL + "step 3 of 100%",
        LABEL + "a table",
        LABEL + "of two lines",
        LABEL + "crashed",
    ]
    assert shown[-1] == "after the run", "the label ends with the run"
    assert all(line.startswith(LABEL) for line in shown[:-1]), "the traceback too"
    assert logging.getLogRecordFactory() is factory
    assert "after the run" not in path.read_text()


@pytest.mark.slow
def test_runs_in_parallel_workers_label_their_lines(
    tmp_path: Path, debug_config: DeptConfig, capfd: pytest.CaptureFixture[str]
) -> None:
    # Two plans that fail at once (no such model): the workers' own lines are what is tested.
    config = {**to_run_config(debug_config), "model": "no-such"}
    plans = [
        compare.Plan(method, 0.01, config, str(tmp_path / method), 1, {})
        for method in ("std-0", "glob")
    ]

    results = compare.run_all(plans, jobs=2)

    assert [r["method"] for r in results] == ["std-0", "glob"]
    assert all("ConfigError" in r["error"] for r in results)
    assert all(r["global_vocab_size"] == debug_config.global_vocab_size for r in results)
    console = capfd.readouterr().err.splitlines()
    for plan in plans:
        ours = [line for line in console if f"[{plan.label}] " in line]
        assert any(line.endswith(f"[{plan.label}] crashed") for line in ours), plan.label
        log = (Path(plan.out_dir) / "run.log").read_text().splitlines()
        assert log and all(f"[{plan.label}] " in line for line in log), plan.label
