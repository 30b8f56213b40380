"""dept compare: end to end on the debug preset (every method, one table, crashes shown), and
its planning: one vocabulary size for every method, rounds from the budget (tokens or bytes
of text), -c overrides, its help."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dept.config import ConfigError, DeptConfig
from dept.data.sources import load_sources
from dept_cli import compare, compare_resume
from dept_cli.comparison_report import render_markdown
from dept_cli.methods import METHODS
from dept_cli.text_budget import TextRates
from tests.helpers import share_cache, synthetic_sources

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_compare_runs_every_method_and_reports_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path
) -> None:
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        "- {name: synth-latin, path: 'builtin:synthetic-latin', vocab-size: 512}\n"
        "- {name: synth-greek, path: 'builtin:synthetic-greek'}\n"  # SPEC-OPT: the global 600
    )
    real_baseline = compare._run_baseline

    def act_crashes(plan: compare.Plan) -> dict:
        if plan.method == "act":
            raise FloatingPointError("loss became nan")
        return real_baseline(plan)

    monkeypatch.setattr(compare, "_run_baseline", act_crashes)
    # One torch thread, like every other test (tests/conftest.py): with --jobs 1 compare
    # takes all cores, and two threads on the two shared cores ran this 5-10x slower.
    monkeypatch.setattr(compare.os, "sched_getaffinity", lambda pid: {0})
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)  # where compare keeps its nodes' state
    # fmt: off
    args = ["--sources-file", str(sources), "--model", "debug", "--tokens", "4096",
            "--local-steps", "4", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "2",
            "--global-vocab-size", "600", "--eval-bytes", "2048", "--lrs", "0.01",
            "--jobs", "1", "--out", str(out)]
    # fmt: on

    assert compare.main(args) == 0

    report = json.loads((out / "comparison.json").read_text())
    assert set(report["methods"]) == set(METHODS)
    assert len(report["sweep"]) == len(METHODS)
    assert "FloatingPointError" in report["methods"]["act"]["error"]
    for method in ("std-0.3", "glob", "trim", "spec", "spec-opt"):
        result = report["methods"][method]
        assert result["tokens"] == 2 * 2 * 4 * 4 * 64, method  # 2 rounds, same budget for all
        assert set(result["sources"]) == {"synth-latin", "synth-greek"}
        assert result["curve"][-1][1] < result["curve"][0][1], f"{method} learned nothing"
    spec, glob = report["methods"]["spec"], report["methods"]["glob"]
    assert spec["bytes"] < glob["bytes"] < report["methods"]["std-0"]["bytes"]
    table = (out / "comparison.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| source |"))
    assert header.count("|") == len(METHODS) + 2, "one column per method"
    assert "crashed: FloatingPointError" in table
    assert (out / "comparison.png").stat().st_size > 0
    spec_opt = report["methods"]["spec-opt"]
    assert spec_opt["source_vocab_sizes"] == {"synth-latin": 512, "synth-greek": 600}
    assert spec_opt["global_vocab_size"] == glob["global_vocab_size"] == 600
    assert glob["source_vocab_sizes"] == {"synth-latin": 600, "synth-greek": 600}
    rows = spec_opt["embedding_params"]  # one row per token of each source's own tokenizer
    assert rows["synth-greek"] * 512 == rows["synth-latin"] * 600, "trained at the sizes shown"
    assert "| per source | " + " | ".join(["600"] * 7 + ["512–600"]) + " |" in table


def _args(tmp_path: Path, *extra: str) -> compare.argparse.Namespace:
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        "- {name: given, path: 'builtin:synthetic-latin', vocab-size: 512}\n"
        "- {name: omitted, path: 'builtin:synthetic-greek'}\n"
    )
    return compare.parse_args(["--sources-file", str(sources), "--model", "debug", *extra])


def test_spec_opt_gets_the_global_vocab_size_where_a_source_gives_none(tmp_path: Path) -> None:
    args = _args(tmp_path, "--global-vocab-size", "1024", "--lrs", "0.01")
    out = tmp_path / "out"

    plans = {p.method: p for p in compare.make_plans(args, compare.base_config(args, out), out)}

    assert plans["spec-opt"].vocab_sizes == {"given": 512, "omitted": 1024}, "explicit is kept"
    for method in ("std-0", "act", "glob", "trim", "spec"):
        assert plans[method].vocab_sizes == {"given": 1024, "omitted": 1024}, method
        assert plans[method].global_vocab_size == 1024
    written = {s.name: s.vocab_size for s in load_sources(out / compare.COMPARED_SOURCES)}
    assert written == {"given": 512, "omitted": 1024}, "every run reads the equalised file"
    assert plans["spec-opt"].run_config["sources-file"] == str(out / compare.COMPARED_SOURCES)


def test_the_budget_becomes_rounds_as_the_help_says(tmp_path: Path) -> None:
    defaults = compare.parse_args(["--sources-file", "x.yaml"])
    corpora = load_sources(ROOT / "benchmarks" / "corpora.yaml")
    budget = (defaults.tokens, len(corpora), defaults.local_steps, defaults.batch_size)

    assert budget == (550_000, 9, 40, 4) and defaults.seq_len == 64, "the help's worked example"
    assert compare.rounds_for(*budget, defaults.seq_len) == 6
    assert compare.rounds_for(1, 9, 40, 4, 64) == 1, "never zero rounds"
    args = _args(tmp_path, "--tokens", "9000", "--local-steps", "4", "--batch-size", "2")
    base = compare.base_config(args, tmp_path / "out")
    assert (base.num_server_rounds, base.local_steps) == (9, 4)  # 9000 / (2 x 4 x 2 x 64) = 8.8


def _small_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path, methods: str, lrs: str
) -> list[str]:
    """The arguments of a two-round debug comparison into ``tmp_path/out``, on one thread."""
    monkeypatch.setattr(compare.os, "sched_getaffinity", lambda pid: {0})
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)
    # fmt: off
    return ["--sources-file", str(synthetic_sources(tmp_path, "latin", "greek")), "--model",
            "debug", "--tokens", "2048", "--local-steps", "2", "--seq-len", "64", "--eval-bytes",
            "1024", "--methods", methods, "--lrs", lrs, "--jobs", "1", "--out", str(out)]
    # fmt: on


def test_a_stopped_comparison_reuses_finished_runs_of_the_same_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path
) -> None:
    out = tmp_path / "out"
    argv = _small_comparison(tmp_path, monkeypatch, node_cache, "std-0", "0.01,0.02")
    assert compare.main(argv) == 0
    first = json.loads((out / "comparison.json").read_text())["sweep"]
    (out / "runs" / "std-0-lr0.02" / "result.json").unlink()  # as if stopped during that run
    ran = []
    real = compare._run_baseline
    monkeypatch.setattr(compare, "_run_baseline", lambda plan: ran.append(plan.lr) or real(plan))

    assert compare.main(argv) == 0
    assert ran == [0.02], "only the unfinished run runs again"
    again = json.loads((out / "comparison.json").read_text())["sweep"]
    assert [r["sources"] for r in again] == [r["sources"] for r in first]
    plan_file = out / "runs" / "std-0-lr0.01" / "plan.json"
    older = json.loads(plan_file.read_text())
    del older["download-compression"]  # planned before that key existed
    plan_file.write_text(json.dumps(older))
    assert compare.main(argv) == 0
    assert ran == [0.02], "a key added since the plan counts at its default there"
    assert compare.main([*argv, "-c", "weight-decay=0.0"]) == 0
    assert ran == [0.02, 0.01, 0.02], "another run config runs everything afresh"


@pytest.mark.slow  # two in-process federations (8 s): the fast tier stays under 150 s
def test_a_federated_run_stopped_part_way_goes_on_from_its_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path
) -> None:
    out = tmp_path / "out"
    argv = _small_comparison(tmp_path, monkeypatch, node_cache, "glob", "0.01")
    assert compare.main(argv) == 0
    run = out / "runs" / "glob-lr0.01"
    first = json.loads((run / "result.json").read_text())
    assert first["rounds"] == 2 and "resumed_after" not in first
    (run / "result.json").unlink()  # stopped during round 2, after its clients had trained
    shutil.rmtree(run / "checkpoints" / "round-0002")
    resumed = []
    real = compare._run_federated
    monkeypatch.setattr(
        compare, "_run_federated", lambda plan, resume: resumed.append(resume) or real(plan, resume)
    )

    assert compare.main(argv) == 0
    again = json.loads((run / "result.json").read_text())
    assert resumed == [True] and again["resumed_after"] == 1
    assert [r for r, _ in again["curve"]] == [0, 1, 2], "the curve is the whole run's"
    assert again["sources"] == first["sources"], "going on gives the run it would have been"
    assert again["tokens"] == first["tokens"] and again["bytes"] == first["bytes"]
    summary = json.loads((run / "summary.json").read_text())
    assert again["wall_s"] == summary["wall_s"], "the run's clock, across both invocations"
    args = compare.parse_args([*argv, "-c", "weight-decay=0.0"])
    (changed,) = compare.make_plans(args, compare.base_config(args, out), out)
    assert compare_resume.stopped_after(changed) is None, "another run config starts afresh"


def test_a_glob_run_planned_before_embedding_rows_is_not_taken_for_one_of_seen_rows(
    tmp_path: Path,
) -> None:
    # Prepare: a finished GLOB and STD run, planned before the key existed
    args = _args(tmp_path, "--methods", "glob,std-0", "--lrs", "0.01")
    plans = {}
    for plan in compare.make_plans(args, compare.base_config(args, tmp_path), tmp_path):
        Path(plan.out_dir).mkdir(parents=True)
        older = json.loads(compare_resume.dumps(plan.run_config))
        assert older.pop("embedding-rows") == "seen"
        (Path(plan.out_dir) / compare_resume.PLAN_FILE).write_text(json.dumps(older))
        (Path(plan.out_dir) / compare_resume.RESULT_FILE).write_text("{}")
        plans[plan.method] = plan
    # Execute, Assert: GLOB sent every row then; STD's φ never travelled
    assert compare_resume.finished_result(plans["glob"]) is None
    assert compare_resume.finished_result(plans["std-0"]) == {}


def test_help_shows_every_default_and_how_the_budget_becomes_rounds() -> None:
    text = compare.build_parser().format_help()

    options = re.findall(r"^  (--[a-z-]+)(.*?)(?=^  -|^\S|\Z)", text, re.M | re.S)
    assert len(options) == 21
    no_default = [
        name for name, help_text in options if "(default: " not in " ".join(help_text.split())
    ]
    assert no_default == ["--sources-file", "--run-config"], "required, or none by default"
    assert "num-server-rounds = max(1, round(tokens / tokens per round))" in text
    assert "so 6 rounds of 40 steps" in text


def test_compare_rejects_an_unknown_method(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        compare.main(["--sources-file", "x.yaml", "--methods", "std,foo"])
    assert "unknown method(s) foo, std" in capsys.readouterr().err


def test_a_missing_sources_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"

    assert compare.main(["--sources-file", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err
        == f"dept compare: error: config key 'sources-file': {missing} does not exist\n"
    )


def test_run_config_overrides_reach_every_run(tmp_path: Path) -> None:
    args = _args(tmp_path, "-c", "inner-optimizer='sgd' act-period=3", "--lrs", "0.01,0.02")
    out = tmp_path / "out"

    plans = compare.make_plans(args, compare.base_config(args, out), out)

    assert {(p.run_config["inner-optimizer"], p.run_config["act-period"]) for p in plans} == {
        ("sgd", 3)
    }


def test_a_key_compare_sets_itself_is_refused_with_its_option(tmp_path: Path) -> None:
    args = _args(tmp_path, "-c", "local-steps=3 lr=0.1")

    with pytest.raises(ConfigError, match=r"local-steps is compare's own: use --local-steps"):
        compare.base_config(args, tmp_path / "out")
    with pytest.raises(ConfigError, match="lr is compare's own: use --lrs"):
        compare.base_config(args, tmp_path / "out")


def test_a_byte_budget_gives_a_denser_tokenizer_fewer_rounds() -> None:
    rates = TextRates(
        global_rates={"a": 2.0, "b": 4.0},
        own_rates={"a": 4.0, "b": 8.0},  # SPEC-OPT's tokens hold twice the text
        global_sizes={"a": 100, "b": 300},
    )

    assert rates.bytes_per_token("glob") == rates.bytes_per_token("std-0") == 3.0
    assert rates.bytes_per_token("spec-opt") == 6.0
    assert rates.bytes_per_token("std-1") == 0.25 * 2 + 0.75 * 4, "drawn in proportion"
    assert rates.rounds("glob", 12, 1000) == rates.rounds("spec", 12, 1000) == 12
    assert rates.rounds("spec-opt", 12, 1000) == 6
    assert rates.rounds("std-1", 12, 1000) == 10  # 36,000 bytes / 3,500 a round = 10.3
    assert rates.rounds("spec-opt", 1, 1000) == 1, "never zero rounds"


@pytest.mark.slow
def test_compare_by_bytes_trains_every_method_on_the_same_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path
) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek", vocab_size=2000)
    monkeypatch.setattr(compare.os, "sched_getaffinity", lambda pid: {0})
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)
    # fmt: off
    args = ["--sources-file", str(sources), "--model", "debug", "--tokens", "16384",
            "--local-steps", "2", "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "1",
            "--global-vocab-size", "400", "--eval-bytes", "1024", "--lrs", "0.01",
            "--methods", "std-0,spec-opt", "--budget", "bytes", "--jobs", "1", "--out", str(out)]
    # fmt: on

    assert compare.main(args) == 0

    report = json.loads((out / "comparison.json").read_text())
    std, spec_opt = report["methods"]["std-0"], report["methods"]["spec-opt"]
    assert report["budget"] == "bytes"
    assert std["rounds"] == 16 > spec_opt["rounds"], "own tokens of 2000 hold more text"
    per_round = spec_opt["text_bytes"] / spec_opt["rounds"]
    assert abs(spec_opt["text_bytes"] - std["text_bytes"]) <= per_round / 2
    table = (out / "comparison.md").read_text()
    assert "| bytes of text trained | " in table and "same bytes of text" in table


def test_a_comparison_without_std_says_so_where_the_gap_to_std_would_be(
    debug_config: DeptConfig,
) -> None:
    result = {
        "method": "spec-opt",
        "lr": 0.002,
        "global_vocab_size": 400,
        "source_vocab_sizes": {"latin": 300},
        "sources": {"latin": {"val_bpb": 2.0, "val_ppl": 9.0}},
        "curve": [[0, 3.0], [1, 2.0]],
        "bytes": 10,
        "bytes_ddp": 100,
        "embedding_params": {"latin": 300},
        "tokens": 1000,
        "failed": 0,
        "wall_s": 1.0,
    }

    table = render_markdown(debug_config, [result], {"spec-opt": result}, 60.0, "bytes")

    assert "| avg bpb vs best STD | n/a (no STD ran) |" in table
    assert "nan" not in table
