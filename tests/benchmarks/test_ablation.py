"""benchmarks.comparison.ablation: its design is a proper fraction, its effects are recovered,
and it runs end to end on the debug preset with the best rate bracketed."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from benchmarks.comparison import ablation
from tests.helpers import share_cache, synthetic_sources


def test_the_half_fraction_is_balanced_and_orthogonal() -> None:
    cells = ablation.design("half")
    assert len(cells) == 8 and len(ablation.design("full")) == 16
    assert cells[0].high == (False,) * 4, "ours first"
    assert any(all(c.high) for c in cells), "the authors' protocol is a cell"
    for i, j in itertools.combinations(range(4), 2):
        pairs = [(c.high[i], c.high[j]) for c in cells]
        assert all(pairs.count((a, b)) == 2 for a in (False, True) for b in (False, True))


def test_main_effects_recover_additive_effects() -> None:
    true = {"inner": -0.3, "wd": 0.0, "local": 0.12, "outer": 0.05}
    runs = []
    for cell in ablation.design("half"):
        score = 3.0 + sum(e for e, h in zip(true.values(), cell.high, strict=True) if h)
        runs.append(
            {"method": "glob", "cell": list(cell.high), "sources": {"a": {"val_bpb": score}}}
        )
    effects = ablation.main_effects(runs, "glob")
    assert effects == pytest.approx(true)


def test_fewer_local_steps_keep_the_token_budget() -> None:
    ours, short = ablation.design("full")[0], ablation.Cell((False, False, True, False))
    assert ours.overrides(552_960, 9, 4, 64)["num-server-rounds"] == 6
    assert short.overrides(552_960, 9, 4, 64)["num-server-rounds"] == 24


def test_oscillation_and_bracketing() -> None:
    assert ablation.oscillation([(0, 4.0), (1, 3.5), (2, 3.0)]) == 0.0
    assert ablation.oscillation([(0, 4.0), (1, 3.5), (2, 3.7), (3, 3.2)]) == pytest.approx(0.2)
    assert ablation.bracket_rates([0.004], 0.004) == [0.002, 0.008]
    assert ablation.bracket_rates([0.002, 0.004, 0.008], 0.004) == []
    assert ablation.bracket_rates([0.002, 0.004], 0.002) == [0.001]


@pytest.mark.slow
def test_ablation_runs_every_cell_and_brackets_the_best_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path
) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    monkeypatch.setattr(ablation.compare.os, "sched_getaffinity", lambda pid: {0})  # one thread
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)
    # fmt: off
    assert ablation.main(["--sources-file", str(sources), "--model", "debug", "--tokens", "8192",
                          "--methods", "glob", "--lr", "0.01", "--jobs", "1",
                          "--reference", str(tmp_path / "none.json"), "--out", str(out)]) == 0
    # fmt: on
    report = json.loads((out / "ablation.json").read_text())
    at_design = [r for r in report["runs"] if r["lr"] == 0.01]
    assert len(at_design) == 8 and {len(r["curve"]) for r in at_design} == {2, 3}  # 1 or 2 rounds
    assert set(report["main_effects"]["glob"]) == {"inner", "wd", "local", "outer"}
    best = min(report["runs"], key=ablation.average_bpb)
    rates = sorted(r["lr"] for r in report["runs"] if r["cell"] == best["cell"])
    assert rates[0] < best["lr"] < rates[-1], "the best rate has a tried rate on each side"
    table = (out / "ablation.md").read_text()
    assert "| inner | wd | local | outer |" in table and "best STD (reference): n/a" in table
    assert (out / "ablation.png").stat().st_size > 0
