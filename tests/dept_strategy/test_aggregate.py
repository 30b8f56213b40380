"""RoundSpool: replies on disk, combined by the weighted mean, a trimmed mean or the median."""

from pathlib import Path

import numpy as np
import pytest

from dept_strategy.aggregate import RoundSpool

SHAPES = {"w": (3, 2), "b": (4,)}


def _delta(value: float) -> dict[str, np.ndarray]:
    return {n: np.full(s, value, np.float32) for n, s in SHAPES.items()}


def test_the_mean_is_token_weighted_and_the_folder_goes_with_the_round(tmp_path: Path) -> None:
    folder = tmp_path / "round-0001"
    with RoundSpool(folder, SHAPES) as spool:
        kept = [spool.add(_delta(v), w, None) for v, w in ((1.0, 1), (5.0, 3))]
        assert len(list(folder.iterdir())) == 2, "each reply waits on disk"
        combined, frozen = spool.combine(kept)
    assert not folder.exists()
    assert frozen == {}
    assert np.allclose(combined["w"].numpy(), (1 * 1.0 + 3 * 5.0) / 4)


@pytest.mark.parametrize(("rule", "expected"), [("median", 3.0), ("trimmed-mean", 8 / 3)])
def test_robust_rules_ignore_one_extreme_source(tmp_path: Path, rule: str, expected: float) -> None:
    with RoundSpool(tmp_path / "r", SHAPES) as spool:
        kept = [spool.add(_delta(v), 1, None) for v in (2.0, 3.0, 4.0, -1000.0, 3.0)]
        combined, _ = spool.combine(kept, rule, trim_fraction=0.2)
    for name in SHAPES:
        assert np.allclose(combined[name].numpy(), expected), (rule, name)


def test_robust_rules_read_in_chunks_the_same_as_whole(tmp_path: Path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    deltas = [{"w": rng.standard_normal((50, 7)).astype(np.float32)} for _ in range(5)]
    with RoundSpool(tmp_path / "r", {"w": (50, 7)}) as spool:
        kept = [spool.add(d, 1, None) for d in deltas]
        monkeypatch.setattr("dept_strategy.aggregate.CHUNK_VALUES", 64)  # 1 row per chunk
        median, _ = spool.combine(kept, "median")
        trimmed, _ = spool.combine(kept, "trimmed-mean", trim_fraction=0.2)
    stack = np.stack([d["w"] for d in deltas])
    assert np.allclose(median["w"].numpy(), np.median(stack, axis=0))
    assert np.allclose(trimmed["w"].numpy(), np.sort(stack, axis=0)[1:4].mean(axis=0))


def test_row_tensors_average_each_row_over_its_holders(tmp_path: Path) -> None:
    shapes = {"input": (4, 2)}
    with RoundSpool(tmp_path / "r", shapes, row_tensors=("input",)) as spool:
        a = spool.add({"input": np.full((2, 2), 1.0, np.float32)}, 1, np.array([0, 1]))
        b = spool.add({"input": np.full((2, 2), 3.0, np.float32)}, 3, np.array([1, 2]))
        combined, frozen = spool.combine([a, b], "median")  # rows: always the row-wise mean
    phi = combined["input"].numpy()
    assert np.allclose(phi[0], 1.0) and np.allclose(phi[1], 2.5) and np.allclose(phi[2], 3.0)
    assert frozen["input"].tolist() == [False, False, False, True]
