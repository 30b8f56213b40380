"""python -m benchmarks.comparison.compression --quick: every setting runs, and the table shows
the savings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.comparison import compression
from dept.config import ConfigError
from tests.helpers import share_cache


@pytest.mark.slow
def test_quick_run_compares_every_setting_against_none(tmp_path: Path, node_cache: Path) -> None:
    out = tmp_path / "out"
    share_cache(tmp_path / "work" / "state", node_cache)  # the benchmark's --work/state

    compression.main(["--quick", "--out", str(out), "--work", str(tmp_path / "work")])

    report = json.loads((out / "compression.json").read_text())
    runs = {r["setting"]: r for r in report["runs"]}
    assert list(runs) == list(compression.SETTINGS)
    none = runs["none"]["bytes_up"]
    assert 1.9 < none / runs["fp16"]["bytes_up"] < 2.0
    assert 3.5 < none / runs["int8"]["bytes_up"] < 4.0
    assert runs["int8"]["bytes_up"] == runs["int8-no-ef"]["bytes_up"]
    # smaller codes, smaller replies: each setting below the one before it
    order = [
        "int8",
        "topk-0.1",
        "int4",
        "int2",
        "ternary",
        "topk-0.01",
    ]  # 1.02, 0.6, 0.52, 0.27, 0.22, 0.06 B a value
    sizes = [runs[label]["bytes_up"] for label in order]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    assert none / runs["int4"]["bytes_up"] > 6 and none / runs["topk-0.01"]["bytes_up"] > 20
    # ternary decodes to int2's values: the same training, in fewer bytes
    assert runs["ternary"]["avg_val_bpb"] == runs["int2"]["avg_val_bpb"]
    assert runs["topk-0.1"]["topk_density"] == 0.1 and runs["int4"]["topk_density"] is None
    for run in runs.values():
        assert run["dropped"] == 0 and run["avg_val_bpb"] < run["initial_avg_val_bpb"]
        assert len(run["bytes_up_per_round"]) == 2
    table = (out / "compression.md").read_text()
    assert (
        "| int8-no-ef |" in table and "python -m benchmarks.comparison.compression --quick" in table
    )
    assert (out / "compression.png").stat().st_size > 0


@pytest.mark.slow
def test_fragment_settings_halve_the_bytes_each_way(tmp_path: Path, node_cache: Path) -> None:
    # Prepare: the debug body's 2 layers as 2 fragments, one synced per round but the last;
    # every run with a Nesterov outer step (-c)
    out = tmp_path / "out"
    share_cache(tmp_path / "work" / "state", node_cache)
    settings = "none,none+frag-2x2"
    # Execute
    work = str(tmp_path / "work")
    nesterov = "outer-optimizer='nesterov' outer-lr=0.7"
    compression.main(
        ["--quick", "--settings", settings, "--out", str(out), "--work", work, "-c", nesterov]
    )
    # Assert: round 1 sends everyone the whole body and takes one fragment up; round 2, the
    # last, sends only the fragment round 1 changed and takes both up
    report = json.loads((out / "compression.json").read_text())
    assert report["config"]["outer-optimizer"] == "nesterov"
    runs = {r["setting"]: r for r in report["runs"]}
    whole, split = runs["none"], runs["none+frag-2x2"]
    assert split["fragments"] == 2 and split["fragment_period"] == 2
    ratios = {
        way: [
            s / w
            for s, w in zip(
                split[f"bytes_{way}_per_round"], whole[f"bytes_{way}_per_round"], strict=True
            )
        ]
        for way in ("up", "down")
    }
    assert 0.3 < ratios["up"][0] < 0.7 and ratios["up"][1] == 1, ratios
    assert ratios["down"][0] == 1 and 0.3 < ratios["down"][1] < 0.7, ratios
    assert "outer nesterov (lr 0.7" in (out / "compression.md").read_text()
    rows = (out / "compression.csv").read_text().splitlines()
    assert rows[0].startswith("setting,") and rows[2].startswith("none+frag-2x2,none,")
    with pytest.raises(ValueError, match="expected <setting>\\+frag-KxF"):
        compression.split_label("int8+frag-4")


def test_run_config_overrides_may_not_set_what_the_settings_vary(tmp_path: Path) -> None:
    where = ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    with pytest.raises(ConfigError, match="-c compression, fragments: set by each --settings"):
        compression.main(["--quick", *where, "-c", "compression='int8' fragments=2"])
    assert not (tmp_path / "out" / "compression.md").exists()


@pytest.mark.slow
def test_a_finished_setting_is_reused_and_a_changed_one_runs_again(
    tmp_path: Path, node_cache: Path
) -> None:
    # Prepare: a finished run of none
    share_cache(tmp_path / "work" / "state", node_cache)
    where = ["--quick", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]

    def none_run(*extra: str) -> dict:
        compression.main([*where, "--settings", "none", *extra])
        return json.loads((tmp_path / "out" / "compression.json").read_text())["runs"][0]

    first = none_run()
    # Execute: the same command again, then with another outer learning rate
    again = none_run()
    changed = none_run("-c", "outer-lr=0.5")
    # Assert
    assert again == first
    assert changed["avg_val_bpb"] != first["avg_val_bpb"]  # trained again, with half steps
