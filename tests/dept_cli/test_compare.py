"""dept compare end to end on the debug preset: every method, one table, crashes shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dept_cli import compare
from dept_cli.methods import METHODS


def test_compare_runs_every_method_and_reports_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        "- {name: synth-latin, path: 'builtin:synthetic-latin', vocab-size: 512}\n"
        "- {name: synth-greek, path: 'builtin:synthetic-greek', vocab-size: 512}\n"
    )
    real_baseline = compare._run_baseline

    def act_crashes(plan: compare.Plan) -> dict:
        if plan.method == "act":
            raise FloatingPointError("loss became nan")
        return real_baseline(plan)

    monkeypatch.setattr(compare, "_run_baseline", act_crashes)
    out = tmp_path / "out"
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


def test_compare_rejects_an_unknown_method(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        compare.main(["--sources-file", "x.yaml", "--methods", "std,foo"])
    assert "unknown method(s) foo, std" in capsys.readouterr().err
