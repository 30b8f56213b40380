"""data_scaling prepares generated sources in child processes and reports their memory."""

import json
from pathlib import Path

import pytest

from benchmarks.overhead.data_scaling import main, write_source


@pytest.mark.slow
def test_quick_sizes_are_measured_and_cleaned_up(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    assert main(["--quick", "--vocab-size", "400", "--out", str(out), "--work", str(work)]) == 0
    result = json.loads((out / "data_scaling.json").read_text())
    sizes = [row["size_gb"] for row in result["runs"]]
    assert sizes == [0.002, 0.006]
    for row in result["runs"]:
        assert row["peak_rss_mb"] >= row["peak_anon_mb"] > 50
        assert row["mb_per_s"] > 0 and row["cores"] >= 1 and row["dtype"] == "uint16"
        assert 0.9 * row["size_gb"] * 1e3 < row["text_mb"] < 1.1 * row["size_gb"] * 1e3
    assert (
        result["peak_rss_ratio"]
        == result["runs"][1]["peak_rss_mb"] / result["runs"][0]["peak_rss_mb"]
    )
    assert not work.exists(), "generated data is deleted"


@pytest.mark.slow
def test_generated_sources_have_the_size_asked_for(tmp_path: Path) -> None:
    folder = write_source(tmp_path / "s", 300_000)
    train = (folder / "train.txt").read_text(encoding="utf-8")
    assert 300_000 <= len(train.encode()) < 400_000 and "\n\n" in train
    assert (folder / "val.txt").stat().st_size >= 3_000
