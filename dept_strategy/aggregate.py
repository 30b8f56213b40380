"""One round's pseudo-gradients: kept on disk as they arrive, combined once the round is in.

Why keep them: whether a reply is an outlier (:mod:`dept_strategy.screening`) is known only
once the round's median is, and a robust rule needs every source's value of a coordinate.
Why on disk: memory bounds a server with a large body, and holding 64 replies of a 100M body
would take 25.6 GB; a reply is written out (safetensors) and dropped as soon as it arrives,
and the combination reads one tensor at a time.

Rules, for the tensors every accepted reply carries whole (θ, and GLOB's φ):

- ``mean``: Σ (w_k / W) Δ_k with w_k the tokens trained; the weights sum to one, so no
  partial sum can overflow, and each coordinate is summed in float64;
- ``trimmed-mean``: per coordinate, drop the ⌈β·n⌉ largest and smallest of the n values
  (at most (n−1)/2 each) and average the rest; each source counts once;
- ``median``: per coordinate, the median over sources.

TRIM's φ rows are always the row-wise weighted mean over the sources that sent each row
(sources hold different rows, so there is no common set to rank); a row nobody sent is
reported as frozen so the outer step leaves it where it is.
"""

from __future__ import annotations

import math
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from dept_strategy.screening import RULES, UpdateStats, update_stats

CHUNK_VALUES = 1 << 22  # values read at once across all replies by the robust rules


@dataclass(frozen=True)
class Spooled:
    """One reply on disk: its token weight, its φ row ids (TRIM), its sizes, and the factor
    it is combined with (below 1 once clipped: :mod:`dept_strategy.screening`)."""

    path: Path
    weight: float
    rows: np.ndarray | None
    stats: UpdateStats
    scale: float = 1.0

    def read(self, name: str) -> np.ndarray:
        """One tensor, scaled, in float64 (a factor of 1e-42 is no float32 number)."""
        with safe_open(str(self.path), framework="np") as f:  # mapped only while read
            value = f.get_tensor(name).astype(np.float64)
        return value * self.scale if self.scale != 1.0 else value


class RoundSpool:
    """The round's replies in ``folder`` (created here, removed by :meth:`close`)."""

    def __init__(
        self, folder: Path, shapes: dict[str, tuple[int, ...]], row_tensors: tuple[str, ...] = ()
    ) -> None:
        shutil.rmtree(folder, ignore_errors=True)  # what a crashed round left
        folder.mkdir(parents=True)
        self.folder, self.shapes, self.row_tensors = folder, shapes, row_tensors
        self.count = 0

    def __enter__(self) -> RoundSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def add(self, delta: dict[str, np.ndarray], weight: float, rows: np.ndarray | None) -> Spooled:
        """Write one decoded reply (``rows``: its φ row ids, None for all rows)."""
        path = self.folder / f"{self.count:05d}.safetensors"
        self.count += 1
        save_file({k: np.ascontiguousarray(v) for k, v in delta.items()}, str(path))
        return Spooled(path, weight, rows, update_stats(delta, self.row_tensors))

    def combine(
        self, accepted: list[Spooled], rule: str = "mean", trim_fraction: float = 0.0
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(the combined Δ per tensor, float32; the mask of rows nobody sent per row tensor)."""
        if rule not in RULES:
            raise ValueError(f"aggregation rule must be one of {RULES}, got {rule!r}")
        if not accepted:
            raise ValueError("nothing to combine")
        combined: dict[str, torch.Tensor] = {}
        frozen: dict[str, torch.Tensor] = {}
        whole = all(s.rows is None for s in accepted)
        for name, shape in self.shapes.items():
            if name in self.row_tensors and (rule == "mean" or not whole):
                combined[name], frozen[name] = self._row_mean(name, shape, accepted)
                continue  # TRIM's rows: always the row-wise mean
            if name in self.row_tensors:  # GLOB's φ under a robust rule: every row is held
                frozen[name] = torch.zeros(shape[0], dtype=torch.bool)
            if rule == "mean":
                combined[name] = self._mean(name, shape, accepted)
            else:
                combined[name] = self._robust(name, shape, accepted, rule, trim_fraction)
        return combined, frozen

    def _mean(self, name: str, shape: tuple[int, ...], accepted: list[Spooled]) -> torch.Tensor:
        total = sum(s.weight for s in accepted)
        out = np.zeros(shape, dtype=np.float64)
        for spooled in accepted:
            out += (spooled.weight / total) * spooled.read(name)
        return torch.from_numpy(out.astype(np.float32))

    def _row_mean(
        self, name: str, shape: tuple[int, ...], accepted: list[Spooled]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        row_weight = np.zeros(shape[0])
        for spooled in accepted:
            row_weight[_index(spooled.rows)] += spooled.weight
        out = np.zeros(shape, dtype=np.float64)
        held = row_weight > 0
        for spooled in accepted:
            index = _index(spooled.rows)
            share = spooled.weight / np.where(held, row_weight, 1.0)[index]
            out[index] += share.reshape(-1, *([1] * (len(shape) - 1))) * spooled.read(name)
        return torch.from_numpy(out.astype(np.float32)), torch.from_numpy(~held)

    def _robust(
        self,
        name: str,
        shape: tuple[int, ...],
        accepted: list[Spooled],
        rule: str,
        trim_fraction: float,
    ) -> torch.Tensor:
        n = len(accepted)
        trim = min(math.ceil(trim_fraction * n), (n - 1) // 2)
        out = np.empty(shape, dtype=np.float32)
        row_size = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        step = max(1, CHUNK_VALUES // (n * row_size))
        with ExitStack() as stack:
            slices = [
                stack.enter_context(safe_open(str(s.path), framework="np")).get_slice(name)
                for s in accepted
            ]
            scales = np.array([s.scale for s in accepted]).reshape(n, *([1] * len(shape)))
            for start in range(0, shape[0], step):
                stop = min(start + step, shape[0])  # safetensors refuses a slice past the end
                block = np.stack([s[start:stop] for s in slices]).astype(np.float64) * scales
                out[start:stop] = _rank_rule(block, rule, trim)
        return torch.from_numpy(out)


def _rank_rule(block: np.ndarray, rule: str, trim: int) -> np.ndarray:
    """Per coordinate over axis 0 (sources): the median, or the mean after trimming."""
    if rule == "median":
        return np.median(block, axis=0)
    ordered = np.sort(block, axis=0)
    return ordered[trim : block.shape[0] - trim].mean(axis=0)


def _index(rows: np.ndarray | None) -> Any:
    return slice(None) if rows is None else rows
