"""One round's weighted mean of pseudo-gradients, built as replies arrive.

Body tensors are averaged whole. Embedding tensors (GLOB, TRIM) are averaged row by row:
each row over the clients that sent it, each with its token weight; a row nobody sent has
no update and is reported as frozen so the outer step leaves it where it is.

Memory is what bounds a server with a large body, so one float32 sum per tensor is all that
is held, never a copy per reply, and the mean is formed in place in those sums
(``benchmarks/server_scaling.py`` measures it). float32 rather than float64 halves that
memory; summing even 64 replies rounds by about 64 x 2^-24 ≈ 4e-6 of the update, far below
what fp16 compression of the same update (2^-11) already accepts.
"""

from __future__ import annotations

import numpy as np
import torch


class RoundMean:
    """Σ w_k Δ_k per tensor (per row for ``row_tensors``), then the mean on :meth:`result`."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], row_tensors: tuple[str, ...] = ()):
        self.sums = {name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()}
        self.row_weights = {name: np.zeros(shapes[name][0]) for name in row_tensors}
        self.weight = 0.0

    def add(self, delta: dict[str, np.ndarray], weight: float, rows: np.ndarray | None) -> None:
        """Add one reply: ``rows`` are the row ids of its row tensors (None: all rows)."""
        index: np.ndarray | slice = slice(None) if rows is None else rows
        for name, value in delta.items():
            if name in self.row_weights:
                self.sums[name][index] += weight * value
                self.row_weights[name][index] += weight
            else:
                self.sums[name] += weight * value
        self.weight += weight

    def result(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None:
        """(mean Δ per tensor, mask of rows nobody held per row tensor); None if no weight
        or the mean is not finite. The mean is made in place: call it once, after the
        last :meth:`add`."""
        if self.weight <= 0:
            return None
        for name, total in self.sums.items():
            if name in self.row_weights:
                held = self.row_weights[name] > 0
                total[held] /= self.row_weights[name][held, None]
                total[~held] = 0.0
            else:
                total /= self.weight
        if not all(np.isfinite(v).all() for v in self.sums.values()):
            return None
        frozen = {name: torch.from_numpy(w <= 0) for name, w in self.row_weights.items()}
        return {n: torch.from_numpy(v) for n, v in self.sums.items()}, frozen
