"""python -m benchmarks.compression --quick: every setting runs, and the table shows the savings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import compression
from tests.helpers import share_cache


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
        "topk-0.01",
    ]  # 1.02, 0.6, 0.52, 0.27, 0.06 B a value
    sizes = [runs[label]["bytes_up"] for label in order]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    assert none / runs["int4"]["bytes_up"] > 6 and none / runs["topk-0.01"]["bytes_up"] > 20
    assert runs["topk-0.1"]["topk_density"] == 0.1 and runs["int4"]["topk_density"] is None
    for run in runs.values():
        assert run["dropped"] == 0 and run["avg_val_bpb"] < run["initial_avg_val_bpb"]
        assert len(run["bytes_up_per_round"]) == 2
    table = (out / "compression.md").read_text()
    assert "| int8-no-ef |" in table and "python -m benchmarks.compression --quick" in table
    assert (out / "compression.png").stat().st_size > 0


def test_fragment_settings_halve_the_bytes_each_way(tmp_path: Path, node_cache: Path) -> None:
    # Prepare: the debug body's 2 layers as 2 fragments, one synced per round
    out = tmp_path / "out"
    share_cache(tmp_path / "work" / "state", node_cache)
    settings = "none,none+frag-2x2"
    # Execute
    compression.main(
        ["--quick", "--settings", settings, "--out", str(out), "--work", str(tmp_path / "work")]
    )
    # Assert: round 1 sends everyone the whole body, round 2 only the fragment round 1 changed
    runs = {r["setting"]: r for r in json.loads((out / "compression.json").read_text())["runs"]}
    whole, split = runs["none"], runs["none+frag-2x2"]
    assert split["fragments"] == 2 and split["fragment_period"] == 2
    for way in ("up", "down"):
        ratios = [
            s / w
            for s, w in zip(
                split[f"bytes_{way}_per_round"], whole[f"bytes_{way}_per_round"], strict=True
            )
        ]
        assert all(0.3 < r < 0.7 for r in ratios[way == "down" :]), (way, ratios)
    assert split["bytes_down_per_round"][0] == whole["bytes_down_per_round"][0]
    rows = (out / "compression.csv").read_text().splitlines()
    assert rows[0].startswith("setting,") and rows[2].startswith("none+frag-2x2,none,")
    with pytest.raises(ValueError, match="expected <setting>\\+frag-KxF"):
        compression.split_label("int8+frag-4")
