"""dept finetune's tasks: the GLUE formats read, the kind of task told by its labels, and
every problem in a task file named by file and line before any training. The fine-tuning
itself runs on real exports in tests/dept_cli/test_evaluate.py (one comparison for both)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dept.config import ConfigError
from dept_cli.finetune import load_task


def write_task(folder: Path, train: list[dict], test: list[dict], test_name: str = "test") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), (test_name, test)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_whole_labels_make_a_classification_and_pairs_keep_both_sentences(tmp_path: Path) -> None:
    rows = [
        {"sentence1": "a", "sentence2": "b", "label": 2},
        {"sentence1": "c", "sentence2": "d", "label": 0},
    ]
    task = load_task(write_task(tmp_path / "nli", rows, rows[:1], test_name="validation"))

    assert (task.name, task.regression, task.num_labels) == ("nli", False, 3)
    assert task.metric == "accuracy"
    assert task.train[0] == (("a", "b"), 2.0) and len(task.test) == 1


def test_other_numbers_make_a_regression_scored_by_pearson(tmp_path: Path) -> None:
    rows = [{"sentence": "a", "label": 0.5}, {"sentence": "b", "label": 3}]
    task = load_task(write_task(tmp_path / "sts", rows, rows))

    assert (task.regression, task.num_labels, task.metric) == (True, 1, "pearson")


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ([{"text": "no sentence", "label": 1}], r"train.jsonl:1: expected a JSON object"),
        ([{"sentence": "x", "label": "pos"}], r"train.jsonl:1: .*numeric 'label'"),
        ([{"sentence": "x", "label": 1}, {"sentence": "y", "label": 1}], "every label is 1"),
        ([{"sentence": "x", "label": -1}, {"sentence": "y", "label": 1}], "must be 0, 1, 2"),
        ([], "holds no examples"),
    ],
)
def test_a_bad_task_file_is_named_with_its_line(
    tmp_path: Path, train: list[dict], message: str
) -> None:
    folder = write_task(tmp_path / "t", train, [{"sentence": "z", "label": 1}])

    with pytest.raises(ConfigError, match=message):
        load_task(folder)


def test_a_task_without_a_test_split_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"sentence": "x", "label": 0}\n')

    with pytest.raises(ConfigError, match=r"has no test\.jsonl or validation\.jsonl"):
        load_task(folder)
