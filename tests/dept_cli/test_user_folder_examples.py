"""The examples of ``dept eval``, ``dept export`` and ``dept finetune`` that name a user's
own files (a run in ``outputs/dept``, tasks in ``tasks/sst2``, an lm-eval task in
``my-tasks/``) run as printed, in a folder that holds such files: two sources named as the
help names them, finished runs of SPEC-OPT, GLOB and a comparison's STD, two GLUE-format
tasks and a local lm-eval task. What each one writes is checked, not only its exit code.

The runs are made in this process at the ``debug`` size (seconds); the examples run as
the shell runs them, ``dept`` found on PATH."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from client_app.app import app as client_app
from dept_cli import compare
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.dept_cli.test_evaluate import cloze_task
from tests.helpers import debug_run_config, share_cache, with_venv_on_path

SOURCES = """\
- {name: de-novels, path: 'builtin:synthetic-latin', vocab-size: 400}
- {name: ru-chekhov, path: 'builtin:synthetic-cyrillic', vocab-size: 400}
"""
COMPARED_RUN = "outputs/compare/runs/std-0.3-lr0.004"


def _a_finished_run(user: Path, node_cache: Path, variant: str, folder: str) -> None:
    config = debug_run_config(
        user,
        node_cache,
        variant=variant,
        **{
            "sources-file": str(user / "my-sources.yaml"),
            "output-dir": str(user / folder),
            "state-dir": str(user / "state"),
            "num-server-rounds": 1,
            "global-vocab-size": 600,
            "eval-bytes": 2048,
        },
    )
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    run_federation(LocalGrid(client_app, nodes, config), config)


def _a_comparisons_std_run(user: Path, node_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    share_cache(user / "outputs" / "compare" / "state", node_cache)
    monkeypatch.chdir(user)
    # fmt: off
    args = ["--sources-file", "my-sources.yaml", "--model", "debug", "--tokens", "2048",
            "--local-steps", "4", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "2",
            "--eval-bytes", "2048", "--lrs", "0.004", "--methods", "std-0.3", "--jobs", "1"]
    # fmt: on
    assert compare.main(args) == 0
    assert (user / COMPARED_RUN).is_dir()


def _glue_tasks(user: Path) -> None:
    """sst2 (one sentence, a class) and stsb (a pair, a score), as GLUE's files hold them."""
    texts = [(f"lorem ipsum dolor {i} sit", f"амет консектетур {i}") for i in range(20)]
    sst2 = [{"sentence": t, "label": k} for pair in texts for k, t in enumerate(pair)]
    stsb = [
        {"sentence1": a, "sentence2": b, "label": 2.5 + i % 3} for i, (a, b) in enumerate(texts)
    ]
    for name, rows, test in (("sst2", sst2, "validation"), ("stsb", stsb, "validation")):
        folder = user / "tasks" / name
        folder.mkdir(parents=True)
        cut = len(rows) * 3 // 4
        for split, part in (("train", rows[:cut]), (test, rows[cut:])):
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory, node_cache: Path) -> tuple[Path, dict[str, str]]:
    """The user's folder, and the environment their shell has (this venv's ``dept`` on
    PATH)."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "my-sources.yaml").write_text(SOURCES)
    _a_finished_run(folder, node_cache, "spec-opt", "outputs/dept")
    _a_finished_run(folder, node_cache, "glob", "outputs/glob")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _a_comparisons_std_run(folder, node_cache, monkeypatch)
    _glue_tasks(folder)
    cloze_task(folder / "my-tasks", "my_task")
    return folder, with_venv_on_path()


def _run(example: str, user: tuple[Path, dict[str, str]]) -> str:
    folder, env = user
    done = subprocess.run(
        example, shell=True, cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{example}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _results(path: Path) -> list[dict]:
    return json.loads(path.read_text())["results"]


@pytest.mark.slow  # four finished runs, then nine commands
def test_the_examples_on_a_users_files_run_as_printed(user: tuple[Path, dict[str, str]]) -> None:
    folder = user[0]

    _run("dept eval outputs/dept --source de-novels --tasks my_task --include-path my-tasks/", user)
    scored = _results(folder / "outputs/dept/eval/eval.json")
    assert {(r["model"], r["task"]) for r in scored if r["task"] == "my_task"} == {
        ("de-novels", "my_task")
    }

    _run("dept eval outputs/compare/runs/std-0.3-lr0.004", user)
    scored = _results(folder / COMPARED_RUN / "eval/eval.json")
    assert {r["model"] for r in scored} == {"std-0.3"} and all(
        r["bits_per_byte"] > 0 for r in scored
    )

    _run("dept export outputs/dept --source de-novels --out models/de-novels", user)
    assert (folder / "models/de-novels/config.json").is_file()

    _run("dept finetune outputs/dept --task tasks/sst2", user)
    tuned = _results(folder / "outputs/dept/finetune/finetune.json")
    assert {(r["model"], r["task"], len(r["seeds"])) for r in tuned} == {
        ("de-novels", "sst2", 3),
        ("ru-chekhov", "sst2", 3),
    }

    _run(
        "dept finetune outputs/dept --task tasks/sst2 --task tasks/stsb --seeds 3 --epochs 3", user
    )
    tuned = _results(folder / "outputs/dept/finetune/finetune.json")
    assert {(r["task"], r["metric"]) for r in tuned} == {("sst2", "accuracy"), ("stsb", "pearson")}
    assert len(tuned) == 4

    _run("dept finetune outputs/glob --global --task tasks/stsb --epochs 5", user)
    tuned = _results(folder / "outputs/glob/finetune/finetune.json")
    assert {r["model"] for r in tuned} == {"de-novels", "ru-chekhov", "global"}

    _run("dept finetune outputs/compare/runs/std-0.3-lr0.004 --task tasks/sst2", user)
    tuned = _results(folder / COMPARED_RUN / "finetune/finetune.json")
    assert [(r["model"], r["task"]) for r in tuned] == [("std-0.3", "sst2")]
