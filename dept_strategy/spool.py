"""One round's pseudo-gradients on disk, each written as it arrives and read back in pieces.

Why keep them: whether a reply is an outlier (:mod:`dept_strategy.screening`) is known only
once the round's median is, and a robust rule needs every source's value of a coordinate.
Why on disk: holding 16 replies of a 300M body would take 19 GB.

A reply is one file of raw float32 values, its tensors one after the other in the order
given (no header: the server knows each reply's shapes). Writing goes from the reply's own
arrays and reading goes into the caller's buffer (``readinto``), so neither makes a copy of
a whole reply, and no file stays mapped into the server's memory.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from dept_strategy.screening import UpdateStats

FLOAT32 = 4
Layout = dict[str, tuple[int, tuple[int, ...]]]  # tensor name -> (byte offset, shape)


@dataclass(frozen=True)
class Spooled:
    """One reply on disk: its token weight, its φ row ids (where it carries only some: TRIM,
    ``embedding-rows=seen``), its sizes, the factor it is combined with (below 1 once
    clipped: :mod:`dept_strategy.screening`), where in its file each tensor starts
    (``layout``: name → (byte offset, shape)) and, where its rows are not weighted by its
    tokens, each row's own weight (``embedding-row-weight=occurrences``)."""

    path: Path
    weight: float
    rows: np.ndarray | None
    stats: UpdateStats
    layout: Layout
    scale: float = 1.0
    row_weights: np.ndarray | None = None

    @property
    def row_weight(self) -> float | np.ndarray:
        """The weight of each φ row it carries in that row's average."""
        return self.weight if self.row_weights is None else self.row_weights

    def read(
        self, name: str, start: int = 0, stop: int | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Rows ``start:stop`` (of the first axis; all by default) of one tensor, unscaled,
        into ``out`` (a float32 buffer of that shape) or a new array."""
        offset, shape = self.layout[name]
        if shape:
            stop = shape[0] if stop is None else min(stop, shape[0])
            offset += start * math.prod(shape[1:]) * FLOAT32
            shape = (max(0, stop - start), *shape[1:])
        if out is None:
            out = np.empty(shape, np.float32)
        with self.path.open("rb") as f:
            f.seek(offset)
            if f.readinto(_bytes(out)) != out.nbytes:
                raise OSError(f"{self.path} ends before its tensor {name!r} does")
        return out

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, values) of every tensor, unscaled, read one at a time."""
        for name in self.layout:
            yield name, self.read(name)


class RoundSpool:
    """The round's replies in ``folder`` (created here, removed by :meth:`close`)."""

    def __init__(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)  # what a crashed round left
        folder.mkdir(parents=True)
        self.folder = folder
        self.count = 0

    def __enter__(self) -> RoundSpool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def write(self, tensors: Iterable[tuple[str, np.ndarray]]) -> tuple[Path, Layout]:
        """Write one reply's float32 ``tensors`` as they are produced; (its file, its layout).
        If producing them fails (a value the caller refuses), the partial file is removed."""
        path = self.folder / f"{self.count:05d}.f32"
        self.count += 1
        layout: Layout = {}
        try:
            with path.open("wb") as f:
                for name, value in tensors:
                    layout[name] = (f.tell(), tuple(value.shape))
                    f.write(_bytes(np.ascontiguousarray(value, np.float32)))
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path, layout


def _bytes(value: np.ndarray) -> memoryview:
    """The bytes of a contiguous array, as a view (a memoryview cast refuses empty arrays)."""
    if not value.flags.c_contiguous:  # reshape would copy: a read would land in the copy
        raise ValueError("a spool reads and writes contiguous arrays only")
    return value.reshape(-1).view(np.uint8).data
