"""Per-round diagnostics of the sources' pseudo-gradients: their norms and how they interfere.

Interference is the cosine similarity between every pair of a round's updates, for θ and,
where φ is shared, for φ; for TRIM's φ rows the cosine of a pair is taken over the rows
both sources sent (each norm restricted to those rows too). A cosine near 1 says two
sources pull the shared tensors the same way, near 0 that their steps are unrelated, and
below 0 that averaging cancels part of each.

The norms come free, from the sizes the screening took as each reply arrived
(:class:`~dept_strategy.screening.UpdateStats`). For the cosines, the round's replies are
already spooled (:mod:`dept_strategy.spool`): the Gram matrix is accumulated a block of
rows at a time, reading every reply's block once (:data:`CHUNK_VALUES` float64 values in
memory over all replies), so a round costs one more read of its spool and n² dot products
per coordinate, never a body-sized buffer.

Per block of rows r (global row ids for φ), with A the (n, r, C) values (zero where a
source holds no such row) and M the (n, r) mask of rows held:

    dot[a, b] += ⟨A_a, A_b⟩                  (over rows both hold: the others are zero)
    sq[a, b]  += Σ_rows |A_a,row|² · M_b,row  (|a|² over the rows b holds too)
    cos[a, b]  = dot[a, b] / √(sq[a, b] · sq[b, a])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dept_strategy.spool import Spooled

CHUNK_VALUES = 1 << 20  # float64 values of one block, over all replies together


@dataclass
class Gram:
    """Pairwise sums over one group of tensors (θ, or φ) of n updates."""

    dot: np.ndarray  # (n, n) ⟨Δ_a, Δ_b⟩ over the rows both hold
    sq: np.ndarray  # (n, n) |Δ_a|² over the rows b holds as well
    by_tensor: dict[str, np.ndarray] = field(default_factory=dict)  # each tensor's own dot

    @classmethod
    def zeros(cls, n: int) -> Gram:
        return cls(np.zeros((n, n)), np.zeros((n, n)))

    def cosines(self) -> np.ndarray:
        """(n, n) cosine similarity; NaN for a pair with no common nonzero rows."""
        scale = np.sqrt(self.sq * self.sq.T)
        with np.errstate(divide="ignore", invalid="ignore"):
            cos = np.where(scale > 0, self.dot / np.where(scale > 0, scale, 1.0), math.nan)
        return np.clip(cos, -1.0, 1.0)


def gram(replies: list[Spooled], names: list[str], shapes: dict[str, tuple[int, ...]]) -> Gram:
    """The Gram sums of ``replies`` over the tensors ``names`` (unscaled, as sent), and
    each tensor's dot products apart (the direction check weighs tensors alike)."""
    n = len(replies)
    out = Gram.zeros(n)
    for name in names:
        shape = shapes[name]
        num_rows = shape[0] if shape else 1
        cols = math.prod(shape[1:]) if shape else 1
        step = max(1, CHUNK_VALUES // max(1, n * cols))
        part = Gram.zeros(n)
        for start in range(0, num_rows, step):
            _add_block(part, replies, name, start, min(num_rows, start + step), cols)
        out.dot += part.dot
        out.sq += part.sq
        out.by_tensor[name] = part.dot
    return out


def _add_block(
    out: Gram, replies: list[Spooled], name: str, start: int, stop: int, cols: int
) -> None:
    """Fold rows ``start:stop`` (global ids) of tensor ``name`` of every reply into ``out``."""
    n, size = len(replies), stop - start
    block = np.zeros((n, size, cols))
    held = np.zeros((n, size))
    for k, reply in enumerate(replies):
        if reply.rows is None:  # the whole tensor
            block[k] = reply.read(name, start, stop).reshape(size, cols)
            held[k] = 1.0
            continue
        lo, hi = np.searchsorted(reply.rows, (start, stop))  # V_k is sorted
        at = reply.rows[lo:hi] - start
        block[k, at] = reply.read(name, int(lo), int(hi)).reshape(len(at), cols)
        held[k, at] = 1.0
    flat = block.reshape(n, -1)
    out.dot += flat @ flat.T
    out.sq += np.einsum("arc,arc->ar", block, block) @ held.T


def round_diagnostics(
    sources: list[str],
    replies: list[Spooled],
    shapes: dict[str, tuple[int, ...]],
    embedding_names: tuple[str, ...],
    *,
    interference: bool,
    theta: Gram | None = None,
) -> dict[str, Any]:
    """``update_norms`` (per source: θ, and φ where shared) and, with ``interference``,
    ``interference`` (the sources, the cosine matrices, their mean off the diagonal);
    ``theta``: θ's Gram sums of these replies where already read (the direction check)."""
    groups = theta_and_phi(shapes, embedding_names)
    norms = {s: update_norms(r, embedding_names) for s, r in zip(sources, replies, strict=True)}
    out: dict[str, Any] = {"update_norms": norms}
    if interference:
        known = {"theta": theta} if theta is not None else {}
        matrices = {
            g: (known.get(g) or gram(replies, names, shapes)).cosines()
            for g, names in groups.items()
        }
        out["interference"] = {
            "sources": list(sources),
            **{g: m.tolist() for g, m in matrices.items()},
            **{f"{g}_mean_offdiag": mean_off_diagonal(m) for g, m in matrices.items()},
        }
    return out


def theta_and_phi(
    shapes: dict[str, tuple[int, ...]], embedding_names: tuple[str, ...]
) -> dict[str, list[str]]:
    """The tensor names of θ and, where φ is shared, of φ."""
    groups = {"theta": [n for n in shapes if n not in embedding_names]}
    if embedding_names:
        groups["phi"] = [n for n in shapes if n in embedding_names]
    return groups


def update_norms(reply: Spooled, embedding_names: tuple[str, ...]) -> dict[str, float]:
    """The L2 norms of a reply's θ and (where it sent any) φ parts as it is combined (a
    clipped one after its scaling), from the sizes taken as it arrived: no read."""
    count = {"theta": 0, "phi": 0}
    for name, (_, shape) in reply.layout.items():
        count["phi" if name in embedding_names else "theta"] += math.prod(shape)
    stats = reply.stats
    norms = {"theta": stats.body_rms * math.sqrt(count["theta"])}
    if embedding_names:
        norms["phi"] = stats.embedding_rms * math.sqrt(count["phi"])
    return norms


def mean_off_diagonal(matrix: np.ndarray) -> float:
    """The mean of the finite entries off the diagonal (NaN with fewer than two sources)."""
    off = matrix[~np.eye(len(matrix), dtype=bool)]
    off = off[np.isfinite(off)]
    return float(off.mean()) if off.size else math.nan
