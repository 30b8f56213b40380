"""benchmarks.row_sharing: private-row shares and gaps to STD, on made-up streams."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import row_sharing


def test_private_share_counts_tokens_on_rows_no_other_source_uses() -> None:
    ids = {"a": np.array([0, 1, 1, 2]), "b": np.array([2, 3]), "c": np.array([2, 2])}
    assert row_sharing.private_shares(ids, 5) == {"a": 0.75, "b": 0.5, "c": 0.0}


def test_gaps_are_relative_to_std_and_skip_crashed_runs() -> None:
    results = {
        "std-0": {"sources": {"a": {"val_bpb": 2.0}, "b": {"val_bpb": 4.0}}},
        "glob": {"sources": {"a": {"val_bpb": 3.0}, "b": {"val_bpb": 4.0}}},
        "act": {"error": "crashed"},
    }
    gaps = row_sharing.gaps(results)
    assert gaps == {"glob": {"a": pytest.approx(50.0), "b": pytest.approx(0.0)}}
    table = row_sharing.render({"a": 1.0, "b": 0.0}, gaps)
    assert "| a | 1.00 | +50.0% |" in table and "| correlation with the share | | 1.00 |" in table
