"""poisoning.py: a tampering node is caught every round and named; the honest run is not."""

import json
from pathlib import Path

import pytest

from benchmarks.comparison.poisoning import main
from tests.helpers import share_cache


@pytest.mark.slow
def test_a_scaled_update_is_caught_and_named(tmp_path: Path, node_cache: Path) -> None:
    out = tmp_path / "out"
    share_cache(tmp_path / "state", node_cache)  # the benchmark's state-dir: --work/state
    attacks = "honest,x1e6,x1e6/reject"
    argv = ["--quick", "--attacks", attacks, "--out", str(out), "--work", str(tmp_path)]

    assert main(argv) == 0

    result = json.loads((out / "poisoning.json").read_text())
    honest, clipped, rejected = result["runs"]
    assert honest["culprit_named_rounds"] == [] and honest["other_problems"] == 0
    assert clipped["culprit_named_rounds"] == rejected["culprit_named_rounds"] == [1, 2]
    assert "beyond what this round's local training" in clipped["culprit_reason"]
    assert clipped["culprit_tokens_credited"] == honest["culprit_tokens_credited"] > 0
    assert rejected["culprit_tokens_credited"] == 0
    assert result["every_gross_attack_named"] is True
