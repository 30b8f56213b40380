"""Which model stands for a body in the downstream comparison, and the runs it refuses (the
whole path, CPT and fine-tuning included, runs in tests/dept_cli/test_evaluate.py)."""

import json
from pathlib import Path

import pytest

from benchmarks.comparison.downstream import Body, parse_args, prepare
from dept.config import ConfigError, DeptConfig, to_run_config


def _run_folder(folder: Path, result: dict, model: bool) -> Path:
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result))
    (folder / "plan.json").write_text(json.dumps(to_run_config(DeptConfig(seq_len=96))))
    if model:
        (folder / "model").mkdir()
        (folder / "model" / "config.json").write_text("{}")
    return folder


def test_a_baseline_stands_for_itself_with_its_saved_model(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path / "std", {"tokens": 1000, "method": "std-0.3"}, model=True)

    made = prepare(Body("std-0.3", folder), tmp_path / "work", cpt_steps=10)

    assert made.folder == folder / "model" and made.made == "the run's model"
    assert (made.extra_tokens, made.pretrain_tokens, made.seq_len) == (0, 1000, 96)


def test_a_crashed_run_or_one_without_a_model_is_refused_naming_it(tmp_path: Path) -> None:
    crashed = _run_folder(tmp_path / "crashed", {"error": "ValueError: boom"}, model=False)
    bare = _run_folder(tmp_path / "bare", {"tokens": 5}, model=False)

    with pytest.raises(ConfigError, match=r"crashed.*boom"):
        prepare(Body("x", crashed), tmp_path / "work", 10)
    with pytest.raises(ConfigError, match="must run again"):
        prepare(Body("y", bare), tmp_path / "work", 10)


def test_a_run_argument_must_name_a_comparison_run(tmp_path: Path, capsys) -> None:
    (tmp_path / "tasks" / "t").mkdir(parents=True)
    (tmp_path / "tasks" / "t" / "train.jsonl").write_text("")
    with pytest.raises(SystemExit):
        parse_args(["--tasks", str(tmp_path / "tasks"), "--run", f"glob={tmp_path}"])
    assert "LABEL=DIR" in capsys.readouterr().err
