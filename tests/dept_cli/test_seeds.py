"""dept compare --seeds: every method and rate under N seeds, pooled into means with the
spread of the average, the first seed in a one-seed comparison's folder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dept.config import DeptConfig
from dept_cli import compare
from dept_cli.comparison_report import SPREAD, best_per_method, render_markdown
from dept_cli.seeds import pool_seeds
from tests.helpers import share_cache, synthetic_sources


def _result(method: str, lr: float, seed: int, a: float, b: float) -> dict:
    return {
        "method": method,
        "lr": lr,
        "seed": seed,
        "global_vocab_size": 400,
        "source_vocab_sizes": {"a": 400, "b": 400},
        "sources": {"a": {"val_bpb": a, "val_ppl": 2 * a}, "b": {"val_bpb": b, "val_ppl": 2 * b}},
        "curve": [[0, 3.0], [1, (a + b) / 2]],
        "bytes": 10,
        "bytes_ddp": 100,
        "embedding_params": {"a": 1, "b": 1},
        "tokens": 1000,
        "failed": 0,
        "wall_s": 1.0,
    }


def test_seeds_pool_into_per_source_means_and_the_spread_of_the_average() -> None:
    runs = [
        _result("spec-opt", 0.002, 0, 2.0, 4.0),  # average 3.0
        _result("spec-opt", 0.002, 1, 2.2, 4.2),  # 3.2
        _result("spec-opt", 0.002, 2, 1.8, 4.4),  # 3.1
        _result("spec-opt", 0.004, 0, 9.0, 9.0),
        _result("spec-opt", 0.004, 1, 9.0, 9.0),
        {**_result("spec-opt", 0.004, 2, 0, 0), "error": "FloatingPointError: nan"},
    ]

    pooled = pool_seeds(runs)

    assert len(pooled) == 2
    good, crashed = pooled
    assert good["sources"]["a"]["val_bpb"] == pytest.approx(2.0)
    assert good["sources"]["b"]["val_ppl"] == pytest.approx(2 * 4.2)
    assert good[SPREAD] == pytest.approx(0.1) and good["seeds"] == [0, 1, 2]
    assert "error" in crashed, "a rate where a seed crashed is not a mean of the survivors"
    assert best_per_method(pooled)["spec-opt"] is good
    assert good["curve"] == [(0, 3.0), (1, pytest.approx(3.1))], "each round's mean"
    single = pool_seeds(runs[:1])[0]
    assert SPREAD not in single and single["seeds"] == [0]


def test_the_table_gives_mean_and_spread_and_names_the_seeds(debug_config: DeptConfig) -> None:
    pooled = pool_seeds([_result("glob", 0.01, s, 2.0 + s / 10, 3.0) for s in range(3)])

    table = render_markdown(debug_config, pooled, {"glob": pooled[0]}, 60.0)

    assert "2.5500 ± 0.0500 (3 seeds)" in table, "the average row and the sweep"
    assert "| average before training (round 0) | 3.0000 |" in table
    assert f"seeds {debug_config.seed} to {debug_config.seed + 2} per method and rate" in table


def test_each_seed_is_a_plan_and_the_first_is_a_one_seed_comparisons_folder(
    tmp_path: Path,
) -> None:
    sources = synthetic_sources(tmp_path, "latin")
    argv = ["--sources-file", str(sources), "--model", "debug", "--methods", "glob,std-0"]
    args = compare.parse_args([*argv, "--lrs", "0.01", "--seeds", "3", "--seed", "5"])
    out = tmp_path / "out"

    plans = compare.make_plans(args, compare.base_config(args, out), out)

    glob = [p for p in plans if p.method == "glob"]
    assert [p.run_config["seed"] for p in glob] == [5, 6, 7]
    assert [Path(p.out_dir).name for p in glob] == [
        "glob-lr0.01",
        "glob-lr0.01-seed6",
        "glob-lr0.01-seed7",
    ]
    assert [p.label for p in glob] == ["glob lr 0.01", "glob lr 0.01 seed 6", "glob lr 0.01 seed 7"]
    assert len(plans) == 6
    with pytest.raises(SystemExit):
        compare.parse_args([*argv, "--seeds", "0"])


@pytest.mark.slow  # two debug federations
def test_compare_with_two_seeds_reports_the_spread_and_keeps_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path
) -> None:
    monkeypatch.setattr(compare.os, "sched_getaffinity", lambda pid: {0})
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)
    # fmt: off
    args = ["--sources-file", str(synthetic_sources(tmp_path, "latin", "greek")),
            "--model", "debug", "--tokens", "2048", "--local-steps", "4", "--batch-size", "4",
            "--seq-len", "64", "--warmup-steps", "2", "--global-vocab-size", "600",
            "--eval-bytes", "2048", "--lrs", "0.01", "--methods", "spec-opt", "--seeds", "2",
            "--jobs", "1", "--out", str(out)]
    # fmt: on

    assert compare.main(args) == 0

    report = json.loads((out / "comparison.json").read_text())
    assert [r["seed"] for r in report["runs"]] == [0, 1]
    first, second = (sum(s["val_bpb"] for s in r["sources"].values()) / 2 for r in report["runs"])
    assert first != second, "the seeds train differently"
    pooled = report["methods"]["spec-opt"]
    assert pooled[SPREAD] == pytest.approx(math.sqrt((first - second) ** 2 / 2))
    assert "± " in (out / "comparison.md").read_text()
