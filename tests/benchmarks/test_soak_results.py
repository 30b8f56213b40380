"""The fault soak's committed results say what their files hold: each table in
``benchmarks/results/fault-soak/README.md`` is the one its ``fault_soak.json`` renders, each
JSON's table by kind is the one its faults give, and docs/robustness.md's long-soak figures
are the long soak's. A rerun whose files are committed without the prose fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.soak import report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "fault-soak"
ROBUSTNESS = ROOT / "docs" / "robustness.md"


def _result(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "fault_soak.json").read_text())


@pytest.mark.parametrize("name", ["long", "short"])
def test_a_soaks_table_is_the_one_its_faults_give(name: str) -> None:
    result = _result(RESULTS / name)

    assert report.by_kind(result["faults"]) == result["by_kind"]
    assert "\n".join(report.kind_table(result["by_kind"])) in (RESULTS / "README.md").read_text()


def test_the_ten_short_soaks_table_is_theirs() -> None:
    results = [_result(p.parent) for p in sorted(RESULTS.glob("short-ten/seed-*/fault_soak.json"))]

    assert len(results) == 10
    readme = (RESULTS / "README.md").read_text()
    assert all(line in readme for line in report.many(results).splitlines())


def test_the_docs_long_soak_figures_are_the_long_soaks() -> None:
    result = _result(RESULTS / "long")
    paragraph = re.search(
        r"^The long soak, run as printed.*?(?:\n\n|\Z)", ROBUSTNESS.read_text(), re.S | re.M
    )
    assert paragraph, "docs/robustness.md lost its long-soak paragraph"
    text = " ".join(paragraph.group(0).split())
    medians = {kind: row["median_recovery_s"] for kind, row in result["by_kind"].items()}
    counts = {row["faults"] for row in result["by_kind"].values()}
    last_round = max(int(fault["done_before"]) for fault in result["faults"])

    assert (
        f"{len(result['faults'])} faults, {min(counts)}–{max(counts)} of each of its "
        f"{len(result['by_kind'])} kinds" in text
    )
    assert f"median recovery {round(min(medians.values()))} s" in text
    assert f"to {round(max(medians.values()))} s" in text
    assert f"fault in after round {last_round}" in text
    assert f"({result['final']['relative_bpb_gap']:+.4%}" in text
    assert not any(result["checks"].values())
