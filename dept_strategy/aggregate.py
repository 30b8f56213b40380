"""One round's pseudo-gradients combined into the update the outer optimizer steps with.

Rules, for the tensors every accepted reply carries whole (θ, and GLOB's φ):

- ``mean``: Σ (w_k / W) Δ_k with w_k the tokens trained, kept as a running weighted mean
  (:class:`RunningMean`) that each reply is folded into as it arrives, straight from the
  message's arrays; each step is taken in float64 and is a convex combination, so no
  value can overflow;
- ``trimmed-mean``: per coordinate, drop the ⌈β·n⌉ largest and smallest of the n values
  (at most (n−1)/2 each) and average the rest; each source counts once;
- ``median``: per coordinate, the median over sources.

φ rows sent by only some sources (TRIM's V_k, and ``embedding-rows=seen``) are always the
row-wise weighted mean over the sources that sent each row (sources hold different rows, so
there is no common set to rank), each weighted by its source's tokens or its own occurrences
(:attr:`~dept_strategy.spool.Spooled.row_weight`); a row nobody sent is reported as frozen
so the outer step leaves it where it is.

Memory, above the body and the outer optimizer's state: the mean holds one body-sized
float32 sum while replies arrive, plus the reply being read (``server-memory=lean``: the sum
is made from the spool once the last reply is in, so only one of the two exists at a
time, at the cost of reading every reply back); the robust rules need every
reply, so they read them back from the round's spool (:mod:`dept_strategy.spool`) a chunk
of coordinates at a time into one body-sized result. A reply the screening clips or drops
is only known once the round is in; the mean is then refolded from the spool into the same
buffer, so that case costs a read of the round, not memory.

The mean is folded in source order, whatever order the replies arrive in: float32 rounding
depends on the order, and a resumed deployment must reproduce the body exactly. A reply is
folded from its message only when every sampled source before it is folded; one that comes
early waits on the spool and is read back once at the end (:meth:`RunningMean.complete`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from dept_strategy.screening import RULES
from dept_strategy.spool import Spooled

CHUNK_VALUES = 1 << 20  # values converted to float64 (robust rules: across all replies) at once


class RunningMean:
    """The weighted mean of the replies folded in so far, one float32 buffer per tensor
    (``row_tensors``: averaged per row over the replies holding it); ``order``: the round's
    sampled sources, sorted, in which :meth:`offer` folds them."""

    def __init__(
        self,
        shapes: dict[str, tuple[int, ...]],
        row_tensors: tuple[str, ...] = (),
        order: Sequence[str] = (),
    ) -> None:
        self.order, self.folded = list(order), 0
        self.means = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
        self.row_tensors = tuple(n for n in row_tensors if n in shapes)
        self.row_weight = {n: np.zeros(shapes[n][0]) for n in self.row_tensors}
        self.weight = 0.0
        self.held: list[tuple[str, float]] = []  # (spool file, scale) of each reply folded in

    def add(self, reply: Spooled, tensors: Iterable[tuple[str, np.ndarray]] | None = None) -> None:
        """Fold ``reply`` in, its values from ``tensors`` (the message's own, as it arrives)
        or else read back from its spool file."""
        self.weight += reply.weight
        rows = slice(None) if reply.rows is None else reply.rows
        for name in self.row_tensors:
            self.row_weight[name][rows] += reply.row_weight
        for name, value in reply.tensors() if tensors is None else tensors:
            mean = self.means[name]
            if name in self.row_tensors:  # (R, C) rows of which the reply holds ``rows``
                share = np.reshape(reply.row_weight / self.row_weight[name][rows], (-1, 1))
                _fold(mean.reshape(mean.shape[0], -1), value, share, reply.rows, reply.scale)
            else:  # a whole tensor: R values of one column
                share = np.broadcast_to(reply.weight / self.weight, (mean.size, 1))
                _fold(mean.reshape(-1, 1), value, share, None, reply.scale)
        self.held.append((str(reply.path), reply.scale))

    def offer(self, source: str, reply: Spooled, tensors: Iterable[tuple[str, np.ndarray]]) -> None:
        """Fold ``reply`` in from ``tensors`` now if ``source`` is the next of ``order``;
        otherwise it stays on the spool until :meth:`complete`."""
        if self.folded < len(self.order) and self.order[self.folded] == source:
            self.add(reply, tensors)
            self.folded += 1

    def complete(self, replies: list[Spooled]) -> None:
        """Make the mean exactly that of ``replies`` (in this order, at their scales): fold
        the rest from disk if what is folded begins the list, else refold them all."""
        wanted = [(str(r.path), r.scale) for r in replies]
        if self.held != wanted[: len(self.held)]:
            self.refold(replies)
            return
        for reply in replies[len(self.held) :]:
            self.add(reply)

    def refold(self, replies: list[Spooled]) -> None:
        """Start again from zero in the same buffers and fold ``replies`` in from disk."""
        for values in (self.means, self.row_weight):
            for value in values.values():
                value.fill(0)
        self.weight, self.held = 0.0, []
        for reply in replies:
            self.add(reply)

    def result(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(the mean per tensor, sharing these buffers; the mask of rows nobody sent)."""
        frozen = {n: torch.from_numpy(w == 0) for n, w in self.row_weight.items()}
        return {n: torch.from_numpy(m) for n, m in self.means.items()}, frozen


def _fold(
    mean: np.ndarray, value: np.ndarray, share: np.ndarray, at: np.ndarray | None, scale: float
) -> None:
    """mean[at] += share · (scale · value − mean[at]), in float64, a chunk of rows at a time.

    ``mean``: (R, C) float32; ``value``: the reply's r rows (any shape of r·C values);
    ``at``: which rows of ``mean`` those are (None: all, r = R); ``share``: (r, 1).
    """
    value = value.reshape(mean.shape[0] if at is None else len(at), -1)
    step = max(1, CHUNK_VALUES // max(1, mean.shape[1]))
    for start in range(0, value.shape[0], step):
        stop = start + step
        where = slice(start, stop) if at is None else at[start:stop]
        old = mean[where].astype(np.float64)
        new = value[start:stop].astype(np.float64)
        if scale != 1.0:  # a clipped reply; the factor can be below float32's range
            new *= scale
        new -= old
        new *= share[start:stop]
        new += old
        mean[where] = new


def combine(
    accepted: list[Spooled],
    shapes: dict[str, tuple[int, ...]],
    row_tensors: tuple[str, ...],
    running: RunningMean | None,
    *,
    rule: str = "mean",
    trim_fraction: float = 0.0,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the combined Δ per tensor of ``shapes``, float32; the mask of rows nobody sent per
    row tensor).

    ``running``: for ``mean``, the mean the replies were folded into as they arrived; what
    it lacks of ``accepted`` is folded in from the spool (:meth:`RunningMean.complete`).
    None: the whole mean is folded from the spool here (``server-memory=lean``)."""
    if rule not in RULES:
        raise ValueError(f"aggregation rule must be one of {RULES}, got {rule!r}")
    if not accepted:
        raise ValueError("nothing to combine")
    if rule != "mean":
        return _robust(accepted, shapes, row_tensors, rule, trim_fraction)
    running = running or RunningMean(shapes, row_tensors)
    running.complete(accepted)
    return running.result()


def _robust(
    accepted: list[Spooled],
    shapes: dict[str, tuple[int, ...]],
    row_tensors: tuple[str, ...],
    rule: str,
    trim_fraction: float,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A rank rule on the tensors every reply holds whole; the row-wise mean on TRIM's rows."""
    whole = all(reply.rows is None for reply in accepted)
    by_rows = () if whole else tuple(n for n in row_tensors if n in shapes)
    rows_mean = RunningMean({n: shapes[n] for n in by_rows}, by_rows)
    for reply in accepted if by_rows else ():
        rows_mean.add(reply, ((n, reply.read(n)) for n in by_rows))
    combined, frozen = rows_mean.result()
    n = len(accepted)
    trim = min(math.ceil(trim_fraction * n), (n - 1) // 2)
    for name, shape in shapes.items():
        if name in by_rows:
            continue
        if name in row_tensors:  # GLOB's φ under a robust rule: every row is held
            frozen[name] = torch.zeros(shape[0], dtype=torch.bool)
        combined[name] = torch.from_numpy(_rank(accepted, name, shape, rule, trim))
    return combined, frozen


def _rank(
    accepted: list[Spooled], name: str, shape: tuple[int, ...], rule: str, trim: int
) -> np.ndarray:
    """One tensor under a rank rule, read a block of rows of every reply at a time."""
    n = len(accepted)
    out = np.empty(shape, np.float32)
    flat = out.reshape(shape[0] if shape else 1, -1)  # (R, C)
    step = max(1, CHUNK_VALUES // (n * flat.shape[1]))
    block = np.empty((n, min(step, flat.shape[0]), flat.shape[1]), np.float32)
    scales = np.array([reply.scale for reply in accepted]).reshape(n, 1, 1)
    for start in range(0, flat.shape[0], step):
        size = min(step, flat.shape[0] - start)
        for k, reply in enumerate(accepted):
            reply.read(name, start, start + size, out=block[k, :size])
        flat[start : start + size] = _rank_rule(block[:, :size] * scales, rule, trim)
    return out


def _rank_rule(block: np.ndarray, rule: str, trim: int) -> np.ndarray:
    """Per coordinate over axis 0 (sources): the median, or the mean after trimming."""
    if rule == "median":
        return np.median(block, axis=0)
    ordered = np.sort(block, axis=0)
    return ordered[trim : block.shape[0] - trim].mean(axis=0)
