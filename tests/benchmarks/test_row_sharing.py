"""benchmarks.comparison.row_sharing: private-row shares and gaps to STD, on made-up streams."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.comparison import row_sharing
from dept.config import load_config, to_run_config
from dept.data.sources import run_sources
from dept.state.workspace import cache_dir
from dept.train.prepare import prepare_source
from dept_cli import compare
from tests.helpers import share_cache, synthetic_sources


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


def test_token_ids_are_the_comparisons_glob_ids_and_write_only_their_cache(
    tmp_path: Path, node_cache: Path
) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    out = tmp_path / "compare"
    args = compare.parse_args(["--sources-file", str(sources), "--global-vocab-size", "600"])
    glob = load_config({**to_run_config(compare.base_config(args, out)), "variant": "glob"})
    specs = run_sources(glob)
    cache = cache_dir(share_cache(out / "state", node_cache))
    expected = {s.name: prepare_source(glob, s, cache, specs).tokens.train for s in specs}
    state = share_cache(tmp_path / "mine" / "state", node_cache)

    ids = row_sharing.token_ids(sources, 600, state)

    assert ids.keys() == expected.keys() == {"synth-latin", "synth-greek"}
    for name, stream in ids.items():
        assert np.array_equal(stream, np.asarray(expected[name])), name
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["state"], "no compare files"
