"""Which shared embedding rows a source's round saw, and which of them its reply carries.

Why it matters (``embedding-rows``, GLOB and TRIM): with tied embeddings every row takes the
softmax's push-down gradient in every batch whose targets do not hold its token. In standard
training those pushes are summed with the pulls of the batches where the token does occur
before AdamW normalises them; in a federated round each source's AdamW turns its own small,
one-sided pushes into steps of about its learning rate, for every token it does not use, and
averaging every row over every source mixes K − 1 such pushes into the one useful pull. At
the paper's scale (500 steps of 256-512 × 2048 tokens on a vocabulary every domain shares)
nearly every row is seen in every source's round and "every row" and "the rows seen" are one
rule; at ours, or across scripts, most rows are unseen by most sources.

A row is *seen* when its token is anywhere in a batch the round trained on (inputs or targets:
either side's gradient then carries the source's own evidence about it). Rows count in the
source's φ block: the global ids for GLOB, the positions in V_k for TRIM (its "other" row is
never shared).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from dept.model.variants import Variant
from dept.wire import keys


class SeenTokens:
    """How often each row's token occurred in the batches that went through :meth:`watch`."""

    def __init__(self, num_rows: int) -> None:
        self.counts = np.zeros(num_rows, np.int64)

    def watch(self, batches: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """``batches`` passed on unchanged, each counted as it is handed out (a batch is
        counted before the step that trains on it)."""
        for batch in batches:
            found = np.bincount(batch.reshape(-1), minlength=len(self.counts))
            self.counts += found[: len(self.counts)]
            yield batch

    def seen(self, rows: int) -> np.ndarray:
        """Of the first ``rows`` rows, which were seen so far (a boolean mask)."""
        return self.counts[:rows] > 0


@dataclass(frozen=True)
class SentRows:
    """The φ rows a reply carries: ``positions`` in the source's shared block, their global
    ``ids`` and, for ``embedding-rows=seen``, how often each occurred in the round."""

    positions: np.ndarray
    ids: np.ndarray
    counts: np.ndarray | None = None

    def arrays(self) -> dict[str, torch.Tensor]:
        """What travels beside the rows: their ids (int32), and counts where sent."""
        out = {keys.EMBEDDING_IDS: torch.from_numpy(self.ids.astype(np.int32))}
        if self.counts is not None:
            out[keys.EMBEDDING_COUNTS] = torch.from_numpy(self.counts.astype(np.int32))
        return out


def sent_rows(
    variant: Variant, rule: str, shared_ids: np.ndarray | None, seen: SeenTokens | None
) -> SentRows | None:
    """The rows a source's reply carries under ``rule`` (``embedding-rows``); None where φ
    travels whole (GLOB under ``all`` and ``seen-zero-filled``) or not at all (SPEC,
    SPEC-OPT). ``shared_ids``: TRIM's V_k; ``seen``: the round's counts."""
    if not variant.shares_embeddings:
        return None
    if rule != "seen" or seen is None:
        if shared_ids is None:  # GLOB: the whole φ
            return None
        return SentRows(np.arange(len(shared_ids)), shared_ids)
    rows = len(shared_ids) if shared_ids is not None else len(seen.counts)
    positions = np.flatnonzero(seen.seen(rows))
    ids = shared_ids[positions] if shared_ids is not None else positions
    return SentRows(positions, ids, seen.counts[positions])


def row_update_sizes(phi: dict[str, torch.Tensor], seen: np.ndarray) -> dict[str, float]:
    """How far a source's round moved its shared φ rows (``phi``: their updates, (rows, C)
    each): the RMS over the rows it saw and over the rest, which only the softmax's push-down
    moved (0.0 where there are none), and how many it saw."""
    mask = torch.from_numpy(seen)
    sizes = {keys.EMBEDDING_ROWS_SEEN: float(seen.sum())}
    for key, rows in (
        (keys.EMBEDDING_UPDATE_SEEN_RMS, mask),
        (keys.EMBEDDING_UPDATE_UNSEEN_RMS, ~mask),
    ):
        squares = sum(float(d[rows].double().pow(2).sum()) for d in phi.values())
        count = sum(d[rows].numel() for d in phi.values())
        sizes[key] = (squares / count) ** 0.5 if count else 0.0
    return sizes


def zero_unseen(phi: dict[str, torch.Tensor], seen: np.ndarray) -> dict[str, torch.Tensor]:
    """``phi``'s updates with the rows not seen set to zero (``seen-zero-filled``)."""
    mask = torch.from_numpy(~seen)
    out = {}
    for name, value in phi.items():
        value = value.clone()
        value[mask] = 0.0
        out[name] = value
    return out


class FrozenUntilSeen:
    """``unseen-rows=freeze``: after every inner step, the shared rows no batch of the round
    has held yet are put back where the round started them (an ablation of what local
    training does with rows it has no evidence about)."""

    def __init__(self, params: dict[str, torch.nn.Parameter], rows: int, seen: SeenTokens) -> None:
        self.params, self.rows, self.seen = params, rows, seen
        self.start = {n: p.detach()[:rows].clone() for n, p in params.items()}  # on its device

    def __call__(self, _global_step: int) -> None:
        unseen = torch.from_numpy(~self.seen.seen(self.rows))
        with torch.no_grad():
            for name, param in self.params.items():
                where = unseen.to(param.device)
                param[: self.rows][where] = self.start[name][where]
