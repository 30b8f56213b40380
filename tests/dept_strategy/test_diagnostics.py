"""Update norms and interference: the blockwise Gram matrix read from the spool against the
dense one of the same updates."""

from pathlib import Path

import numpy as np
import pytest

from dept_strategy import diagnostics
from dept_strategy.diagnostics import gram, mean_off_diagonal, round_diagnostics
from dept_strategy.screening import UpdateSizes
from dept_strategy.spool import RoundSpool, Spooled

SHAPES = {"w": (5, 3), "b": (4,), "emb": (12, 2)}


def _spool(spool: RoundSpool, delta: dict[str, np.ndarray], rows: np.ndarray | None = None):
    tally = UpdateSizes(("emb",))
    path, layout = spool.write(tally.observe(delta.items()))
    return Spooled(path, 1.0, rows, tally.stats(), layout)


def _random(rng: np.random.Generator, shapes: dict) -> dict[str, np.ndarray]:
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def _dense_cosines(vectors: np.ndarray) -> np.ndarray:
    """(n, n) cosines of the rows of ``vectors``, in float64."""
    v = vectors.astype(np.float64)
    norms = np.linalg.norm(v, axis=1)
    return (v @ v.T) / np.outer(norms, norms)


@pytest.mark.parametrize("chunk", [1 << 20, 7])  # one block per tensor; many small blocks
def test_the_gram_matrix_equals_the_dense_one(tmp_path: Path, monkeypatch, chunk: int) -> None:
    # Prepare
    monkeypatch.setattr(diagnostics, "CHUNK_VALUES", chunk)
    rng = np.random.default_rng(0)
    updates = [_random(rng, SHAPES) for _ in range(4)]
    with RoundSpool(tmp_path / "r") as spool:
        replies = [_spool(spool, u) for u in updates]
        # Execute
        found = gram(replies, ["w", "b"], SHAPES)
    # Assert
    dense = np.stack([np.concatenate([u["w"].ravel(), u["b"]]) for u in updates])
    np.testing.assert_allclose(found.dot, dense.astype(np.float64) @ dense.T, rtol=1e-6)
    np.testing.assert_allclose(found.cosines(), _dense_cosines(dense), rtol=1e-6)
    np.testing.assert_allclose(np.diag(found.sq), (dense.astype(np.float64) ** 2).sum(1), rtol=1e-6)


def test_identical_updates_have_cosine_one_and_opposite_minus_one(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    update = _random(rng, SHAPES)
    with RoundSpool(tmp_path / "r") as spool:
        replies = [_spool(spool, u) for u in (update, update, {n: -v for n, v in update.items()})]
        cos = gram(replies, list(SHAPES), SHAPES).cosines()
    np.testing.assert_allclose(cos, [[1, 1, -1], [1, 1, -1], [-1, -1, 1]], atol=1e-6)
    assert mean_off_diagonal(cos) == pytest.approx(-1 / 3)


@pytest.mark.parametrize("chunk", [1 << 20, 5])
def test_trim_rows_are_compared_over_the_rows_both_sent(
    tmp_path: Path, monkeypatch, chunk: int
) -> None:
    # Prepare: three sources holding overlapping sets of the 12 global rows
    monkeypatch.setattr(diagnostics, "CHUNK_VALUES", chunk)
    rng = np.random.default_rng(2)
    held = [np.array([0, 2, 3, 7, 11]), np.array([2, 3, 4, 11]), np.array([1, 5, 6])]
    full = [rng.standard_normal((12, 2)) for _ in held]
    with RoundSpool(tmp_path / "r") as spool:
        replies = [
            _spool(spool, {"emb": f[rows].astype(np.float32)}, rows)
            for f, rows in zip(full, held, strict=True)
        ]
        # Execute
        found = gram(replies, ["emb"], SHAPES)
    # Assert: against the cosine of each pair restricted to their common rows
    cos = found.cosines()
    for a in range(3):
        for b in range(3):
            common = np.intersect1d(held[a], held[b])
            if common.size == 0:
                assert np.isnan(cos[a, b])
                continue
            x, y = full[a][common].ravel(), full[b][common].ravel()
            expected = x @ y / (np.linalg.norm(x) * np.linalg.norm(y))
            assert cos[a, b] == pytest.approx(expected, rel=1e-5)
    own = [np.linalg.norm(f[rows]) for f, rows in zip(full, held, strict=True)]
    np.testing.assert_allclose(np.sqrt(np.diag(found.sq)), own, rtol=1e-5)


def test_update_norms_are_those_of_the_spooled_updates_with_or_without_interference(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(3)
    updates = [_random(rng, SHAPES) for _ in range(2)]
    with RoundSpool(tmp_path / "r") as spool:
        replies = [_spool(spool, u) for u in updates]
        off = round_diagnostics(["x", "y"], replies, SHAPES, ("emb",), interference=False)
        on = round_diagnostics(["x", "y"], replies, SHAPES, ("emb",), interference=True)
    assert "interference" not in off
    assert off["update_norms"] == on["update_norms"]
    theta = np.concatenate([updates[1]["w"].ravel(), updates[1]["b"]])
    assert off["update_norms"]["y"]["theta"] == pytest.approx(np.linalg.norm(theta), rel=1e-6)
    assert off["update_norms"]["y"]["phi"] == pytest.approx(np.linalg.norm(updates[1]["emb"]))
    matrix = np.array(on["interference"]["phi"])
    assert on["interference"]["sources"] == ["x", "y"]
    assert on["interference"]["phi_mean_offdiag"] == pytest.approx(matrix[0, 1])
