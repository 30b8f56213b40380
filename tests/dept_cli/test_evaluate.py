"""dept eval: lm-eval scores an exported model's validation text as the run did (the proof that
an export is the model that trained), runs a user's local task, and refuses what it cannot
evaluate by name; dept finetune tunes the same models with a task head, seed by seed."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from benchmarks.comparison import downstream, ood
from dept.train import devices
from dept_cli import compare, evaluate, finetune
from dept_cli.harness import _metrics, _stream_results, stream_task_name, validation_stream
from tests.dept_cli.test_finetune import write_task
from tests.helpers import share_cache, synthetic_sources

SOURCES = ("synth-latin", "synth-greek")
# Measured on debug runs: 0.00-0.06% (lm-eval also predicts the stream's first token, which
# the run does not, and cuts the text at a character, the run at a token).
SAME_BPB = 0.005
CLOZE = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_the_stream_joins_documents_by_the_end_token_and_counts_each_as_one_byte() -> None:
    stream = validation_stream("s", ["ab", "cdé", "fgh"], "</s>", max_bytes=0)

    assert stream.text == "ab</s>cdé</s>fgh</s>"
    assert stream.bytes == 2 + 1 + 4 + 1 + 3 + 1


def test_the_stream_stops_at_the_runs_bytes_on_a_whole_character() -> None:
    # 2 + 1 bytes, then "é" (2 bytes) would cross 4: the cut keeps "c" only
    stream = validation_stream("s", ["ab", "cé", "never"], "<eos>", max_bytes=4)

    assert stream.text == "ab<eos>c" and stream.bytes == 4


def test_a_source_without_validation_text_is_named() -> None:
    with pytest.raises(ValueError, match="'de-novels' has no validation text"):
        validation_stream("de-novels", [], "</s>", max_bytes=100)


def test_the_task_counts_the_rows_bytes_and_metrics_lose_the_filter_suffix() -> None:
    assert _stream_results({"text": "x</s>", "bytes": 2}, [-3.0]) == {"bits_per_byte": (-3.0, 2)}
    assert _metrics(
        {"alias": "t", "acc,none": 0.5, "acc_stderr,none": "N/A", "exact,strict": 1.0}
    ) == {"acc": 0.5, "exact,strict": 1.0}


def _compare(tmp_path: Path, node_cache: Path) -> Path:
    """A finished debug comparison of STD τ=0 and three DEPT variants: its runs folder."""
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)
    # fmt: off
    args = ["--sources-file", str(synthetic_sources(tmp_path, "latin", "greek")),
            "--model", "debug", "--tokens", "4096", "--local-steps", "4", "--batch-size", "4",
            "--seq-len", "64", "--warmup-steps", "2", "--global-vocab-size", "600",
            "--eval-bytes", "4096", "--lrs", "0.01", "--methods", "std-0,glob,trim,spec-opt",
            "--jobs", "1", "--out", str(out)]
    # fmt: on
    assert compare.main(args) == 0
    return out / "runs"


def _report(run: Path, *argv: str) -> dict:
    assert evaluate.main([str(run), "--device", "cpu", *argv]) == 0
    return json.loads((run / "eval" / "eval.json").read_text())


def _streams(report: dict) -> dict[tuple[str, str], tuple[float, float]]:
    """(model, source): (lm-eval's bits per byte, the run's)."""
    return {
        (row["model"], source): (row["bits_per_byte"], row.get("run_bits_per_byte", math.nan))
        for row in report["results"]
        for source in SOURCES
        if row["task"] == stream_task_name(source)
    }


def cloze_task(folder: Path, name: str = "tiny_cloze") -> Path:
    """A user's multiple-choice lm-eval task ``name`` on local data: its YAML's folder."""
    rows = [
        {"context": "lorem ipsum", "choices": [" dolor", " xyz"], "answer": 0},
        {"context": "α β", "choices": [" γ", " δ", " ε"], "answer": 1},
    ]
    folder.mkdir()
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(CLOZE.format(name=name, data=data))
    return folder


def _script_task(folder: Path, regression: bool = False) -> Path:
    """Which script a line is in: what any pre-trained body of the two learns at once; as a
    regression, a score of 0.25 or 0.75 per script."""
    rows = [
        {"sentence": text, "label": 0.25 + label / 2 if regression else label}
        for i in range(24)
        for label, text in enumerate((f"lorem ipsum dolor {i} sit", f"αβγ δεζ {i} ηθι"))
    ]
    return write_task(folder, rows[:36], rows[36:])


@pytest.mark.slow  # one comparison for every check: each federated run costs CI seconds
def test_lm_eval_scores_every_methods_models_as_their_runs_did(
    tmp_path: Path,
    node_cache: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: eval and finetune size torch's threads to the idle cores; one, as on busy CI
    monkeypatch.setattr(devices, "idle_cores", lambda: 1)
    runs = _compare(tmp_path, node_cache)
    run = {m: next(runs.glob(f"{m}-lr*")) for m in ("std-0", "glob", "trim", "spec-opt")}
    tasks = cloze_task(tmp_path / "tasks")

    # Execute
    reports = {m: _report(run[m]) for m in ("std-0", "trim")}
    reports["glob"] = _report(run["glob"], "--global", "--source", "synth-greek")
    reports["spec-opt"] = _report(
        run["spec-opt"], "--tasks", "tiny_cloze", "--include-path", str(tasks)
    )

    # Assert: every model the run measured scores what the run said, by lm-eval
    for method, report in reports.items():
        streams = _streams(report)
        for key, (got, measured) in streams.items():
            assert math.isclose(got, measured, rel_tol=SAME_BPB), (method, key, got, measured)
    assert set(_streams(reports["std-0"])) == {("std-0", s) for s in SOURCES}
    assert set(_streams(reports["glob"])) == {
        ("synth-greek", "synth-greek"),
        *(("global", s) for s in SOURCES),
    }
    trim_global = _report(run["trim"], "--global", "--source", "synth-latin")
    assert all(
        math.isnan(measured) and got > 0
        for (model, _), (got, measured) in _streams(trim_global).items()
        if model == "global"
    )  # TRIM's global model is scored, though the run never measured it
    # a user's task runs beside the streams, on each source's model
    cloze = [r for r in reports["spec-opt"]["results"] if r["task"] == "tiny_cloze"]
    assert {r["model"] for r in cloze} == set(SOURCES)
    assert all(0.0 <= r["acc"] <= 1.0 and "acc_stderr" in r for r in cloze)
    shown = capsys.readouterr().out
    assert "tiny_cloze" in shown and "tasks (cpu, 1 torch thread(s))" in shown
    # fine-tuning: every model of a run with a fresh head, per seed, the same seed the same
    which_script = _script_task(tmp_path / "which-script")
    assert (
        finetune.main(
            [str(run["std-0"]), "--task", str(which_script), "--seeds", "2", "--epochs", "2"]
        )
        == 0
    )
    tuned = json.loads((run["std-0"] / "finetune" / "finetune.json").read_text())["results"]
    assert [(r["model"], r["metric"]) for r in tuned] == [("std-0", "accuracy")]
    assert 0.5 < tuned[0]["mean"] <= 1.0 and len(tuned[0]["seeds"]) == 2  # scripts tell apart
    shown = capsys.readouterr()
    assert "fine-tuning on the CPU with 1 torch thread(s)" in shown.out  # tests: one thread
    assert re.search(r"std-0 on which-script, seed 1: +\d+%.* \d+/6 \[.*step/s", shown.err)
    assert f"{tuned[0]['mean']:.4f} ± {tuned[0]['sd']:.4f}" in shown.out
    score = _script_task(tmp_path / "script-score", regression=True)
    assert finetune.main([str(run["std-0"]), "--task", str(score), "--seeds", "1"]) == 0
    tuned = json.loads((run["std-0"] / "finetune" / "finetune.json").read_text())["results"]
    assert tuned[0]["metric"] == "pearson" and -1.0 <= tuned[0]["mean"] <= 1.0
    assert tuned[0]["sd"] is None, "one seed measures no spread"
    assert f"{tuned[0]['mean']:.4f} (1 seed)" in capsys.readouterr().out
    argv = [str(run["spec-opt"]), "--source", "synth-greek", "--task", str(which_script)]
    once, again = (
        finetune.run(finetune.parse_args([*argv, "--seeds", "1", "--epochs", "1"]))
        for _ in range(2)
    )
    assert once["results"] == again["results"]
    # the help's --global example, with two tasks at once: the global model too, on each
    argv = [str(run["glob"]), "--global", "--source", "synth-greek", "--task", str(which_script)]
    assert finetune.main([*argv, "--task", str(score), "--seeds", "1", "--epochs", "1"]) == 0
    tuned = json.loads((run["glob"] / "finetune" / "finetune.json").read_text())["results"]
    assert [(r["model"], r["task"]) for r in tuned] == [
        (model, task)
        for model in ("synth-greek", "global")
        for task in ("which-script", "script-score")
    ]
    # the downstream comparison: the global model, CPT for SPEC-OPT, a baseline's own model
    _the_downstream_comparison_fine_tunes_each_body(tmp_path, run)
    # out of distribution: every body on a source no run trained on
    _the_ood_table_scores_each_body_on_a_held_out_source(tmp_path, runs.parent)
    # what cannot be evaluated is named
    with pytest.raises(SystemExit, match="'synth-cyrillic' is not in the run's"):
        evaluate.main([str(run["spec-opt"]), "--source", "synth-cyrillic"])
    with pytest.raises(SystemExit, match="baseline run: one model covers every source"):
        evaluate.main([str(run["std-0"]), "--global"])


def _the_ood_table_scores_each_body_on_a_held_out_source(tmp_path: Path, comparison: Path) -> None:
    (tmp_path / "held-out").mkdir()
    held_out = synthetic_sources(tmp_path / "held-out", "cyrillic")
    out = tmp_path / "ood"
    argv = ["--comparison", str(comparison), "--held-out", str(held_out), "--cpt-steps", "2"]
    argv += ["--work", str(tmp_path / "ood-work"), "--out", str(out)]

    # method by method, as a comparison spread over sessions finishes its sweeps
    assert ood.main([*argv, "--methods", "std-0,glob"]) == 0
    first = {r["method"]: r for r in json.loads((out / "ood.json").read_text())["runs"]}
    assert set(first) == {"std-0", "glob", ood.FRESH}
    assert ood.main([*argv, "--methods", "trim,spec-opt"]) == 0

    rows = {r["method"]: r for r in json.loads((out / "ood.json").read_text())["runs"]}
    assert list(rows) == ["std-0", "glob", "trim", "spec-opt", ood.FRESH]  # the comparison's order
    assert rows[ood.FRESH] == first[ood.FRESH] and rows["glob"] == first["glob"]  # kept
    with pytest.raises(SystemExit, match="--methods spec: not a finished method"):
        ood.main([*argv, "--methods", "spec"])
    zero_shot = {m for m, r in rows.items() if r["zero_shot_bpb"] is not None}
    assert zero_shot == {"std-0", "glob", "trim"}, "SPEC-OPT has no model for unseen text"
    assert all(r["cpt_bpb"] > 0 and r["cpt_tokens"] > 0 for r in rows.values())
    assert all(0 < r["zero_shot_bpb"] < 20 for m, r in rows.items() if m in zero_shot)
    assert (out / "ood.png").is_file()


def _the_downstream_comparison_fine_tunes_each_body(tmp_path: Path, run: dict[str, Path]) -> None:
    tasks = tmp_path / "downstream-tasks"
    _script_task(tasks / "which-script")
    _script_task(tasks / "script-score", regression=True)
    out = tmp_path / "downstream"
    argv = ["--tasks", str(tasks), "--out", str(out), "--work", str(tmp_path / "work")]
    argv += ["--seeds", "2", "--epochs", "1", "--cpt-steps", "2"]
    bodies = [f"--run={m}={run[m]}" for m in ("trim", "spec-opt")]  # std-0's model: above

    assert downstream.main([*argv, *bodies]) == 0

    result = json.loads((out / "downstream.json").read_text())
    made = {m["body"]: m for m in result["models"]}
    assert made["trim"]["made"] == "the global model" and made["trim"]["cpt_tokens"] == 0
    assert made["spec-opt"]["made"].startswith("CPT") and made["spec-opt"]["cpt_tokens"] > 0
    assert len(result["runs"]) == 2 * 2 * 2  # bodies x tasks x seeds
    assert set(result["cells"]["trim"]) == {"which-script", "script-score", "mean over tasks"}
    which = [r["score"] for r in result["runs"] if r["task"] == "which-script"]
    assert all(0.0 <= s <= 1.0 for s in which) and (out / "downstream.png").is_file()
    # run again: every fine-tuning and the CPT model are reused, not redone
    cpt_model = tmp_path / "work" / "models" / "spec-opt" / "model.safetensors"
    made_at = cpt_model.stat().st_mtime_ns
    assert downstream.main([*argv, *bodies]) == 0
    again = json.loads((out / "downstream.json").read_text())
    assert again["runs"] == result["runs"] and cpt_model.stat().st_mtime_ns == made_at


def test_a_folder_without_a_finished_run_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="holds no finished run"):
        evaluate.main([str(tmp_path), "--device", "cpu"])


def test_only_other_tasks_needs_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        evaluate.main(["run", "--no-bits-per-byte"])
    assert "give --tasks" in capsys.readouterr().err
