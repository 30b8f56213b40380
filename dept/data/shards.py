"""A split's token stream on disk: written shard by shard, resumable, read by memory map.

Documents are read in batches of about :data:`ENCODE_BYTES` of text (by plain reads,
:mod:`dept.data.arrow_text`) and encoded by the fast tokenizer's batch encoder, which spreads a
batch over every core (Rayon threads); an EOS follows each
document. Every :data:`BATCHES_PER_SHARD` batches form a shard, appended to one file per
split (``train.bin``: uint16 where the vocabulary fits, else uint32) and committed by
recording the shards and tokens done in ``progress-<split>.json``. A preparation killed
mid-way continues from the last committed shard (whatever was appended after it is cut
off), and gives the same file as one never stopped. One file per split, not one per shard,
so the stream is a single memory map: a block may straddle two shards, and batching and
evaluation index it like any array. Memory stays that of one batch, whatever the source.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from dept.data import arrow_text
from dept.data.pieces import pieces

ENCODE_BYTES = 4_000_000  # text per batch handed to the encoder
BATCHES_PER_SHARD = 16  # the unit of resumption: about 64 MB of text
META_FILE = "meta.json"
log = logging.getLogger(__name__)


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type holding every id: uint16 up to 65,536 tokens, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


@dataclass(frozen=True)
class Plan:
    """How a split is cut: rows per encoder batch, batches per shard."""

    rows_per_batch: int
    batches_per_shard: int = BATCHES_PER_SHARD

    @classmethod
    def for_table(cls, table: datasets.Dataset) -> Plan:
        """Batches of about :data:`ENCODE_BYTES`, from the table's mean row size (its Arrow
        buffers' size, known without reading the text)."""
        data = table.data
        mean_row = data.nbytes / max(1, data.num_rows)
        return cls(rows_per_batch=max(1, int(ENCODE_BYTES / max(mean_row, 1.0))))

    @property
    def rows_per_shard(self) -> int:
        return self.rows_per_batch * self.batches_per_shard


def tokenized_splits(
    tables: dict[str, datasets.Dataset], tokenizer: Tokenizer, eos: int, folder: Path
) -> dict[str, np.ndarray]:
    """Every split of ``tables`` as token ids in ``folder``, encoding those not done yet.

    ``folder`` must be keyed by tokenizer and data, and held under a lock by the caller.
    """
    meta = folder / META_FILE
    if not meta.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        encoder = Tokenizer.from_str(tokenizer.to_str())  # the caller's stays as it was
        encoder.encode_special_tokens = True  # text spelling "<|endoftext|>" is text
        for split, table in tables.items():
            if not (folder / f"{split}.bin").is_file():
                write_split(table, encoder, eos, folder / f"{split}.bin", Plan.for_table(table))
        dtype = token_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
        sizes = {s: (folder / f"{s}.bin").stat().st_size // dtype.itemsize for s in tables}
        _write_meta(meta, {"dtype": dtype.name, "tokens": sizes})
    written = json.loads(meta.read_text())
    dtype = np.dtype(written["dtype"])
    splits = {s: read_split(folder / f"{s}.bin", dtype, written["tokens"][s]) for s in tables}
    if set(written.get("ranges", {})) != set(tables):  # once per cache, older ones included
        _write_meta(meta, {**written, "ranges": {s: id_range(v) for s, v in splits.items()}})
    return splits


def recorded_ranges(folder: Path) -> dict[str, tuple[int, int]]:
    """Each split's smallest and largest token id, as :func:`tokenized_splits` recorded
    them: what a client checks its stream by, without reading a byte of it per message."""
    ranges = json.loads((folder / META_FILE).read_text())["ranges"]
    return {split: (int(low), int(high)) for split, (low, high) in ranges.items()}


def id_range(ids: np.ndarray) -> tuple[int, int]:
    """(min, max) of ``ids``; (0, -1) for no ids (an empty range)."""
    return (int(ids.min()), int(ids.max())) if ids.size else (0, -1)


def _write_meta(meta: Path, content: dict) -> None:
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(json.dumps(content))
    tmp.replace(meta)


def write_split(
    table: datasets.Dataset, tokenizer: Tokenizer, eos: int, path: Path, plan: Plan
) -> None:
    """Encode ``table``'s documents into ``path`` (atomically), continuing an interrupted
    preparation of the same file."""
    dtype = token_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    partial = path.with_name(f".{path.name}.partial")
    progress_file = path.with_name(f"progress-{path.stem}.json")
    done = _committed(progress_file, partial, plan)
    shards = -(-len(table) // plan.rows_per_shard)
    rows = tqdm(
        total=len(table),
        initial=min(len(table), done["shards"] * plan.rows_per_shard),
        desc=f"tokenizing {path.stem}",
        unit="doc",
        disable=None,  # a bar on a terminal only
    )
    texts = arrow_text.batches(table, done["shards"] * plan.rows_per_shard, plan.rows_per_batch)
    with partial.open("r+b" if partial.exists() else "wb") as out, rows:
        out.truncate(done["tokens"] * dtype.itemsize)  # drop what followed the last commit
        out.seek(0, os.SEEK_END)
        for shard in range(done["shards"], shards):
            start = shard * plan.rows_per_shard
            stop = min(len(table), start + plan.rows_per_shard)
            for batch in itertools.islice(texts, plan.batches_per_shard):
                for ids in _encoded(batch.to_pylist(), tokenizer, eos):
                    ids.astype(dtype, copy=False).tofile(out)
                    done["tokens"] += len(ids)
            out.flush()
            os.fsync(out.fileno())
            done["shards"] = shard + 1
            _commit(progress_file, done)
            rows.update(stop - start)
    partial.replace(path)
    progress_file.unlink()


def _committed(progress_file: Path, partial: Path, plan: Plan) -> dict[str, int]:
    """Shards and tokens an earlier, interrupted run committed (none if it was cut otherwise)."""
    fresh = {"shards": 0, "tokens": 0, "rows_per_shard": plan.rows_per_shard}
    if not (progress_file.is_file() and partial.is_file()):
        return fresh
    done = json.loads(progress_file.read_text())
    if done.get("rows_per_shard") != plan.rows_per_shard:
        return fresh
    log.info("%s: continuing after shard %d (%d tokens)", partial, done["shards"], done["tokens"])
    return {k: int(v) for k, v in done.items()}


def _commit(progress_file: Path, done: dict[str, int]) -> None:
    tmp = progress_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(done))
    tmp.replace(progress_file)


def _encoded(texts: list[str], tokenizer: Tokenizer, eos: int) -> Iterator[np.ndarray]:
    """The token ids of ``texts``, an EOS after each document, in arrays of at most
    :data:`ENCODE_BYTES` of text each: a long document is encoded a piece at a time
    (:func:`dept.data.pieces.pieces`), so memory does not grow with it."""
    group: list[str] = []
    ends: list[bool] = []  # whether each piece of the group ends its document
    size = 0
    for text in texts:
        for piece, last in _with_last(pieces(text)):
            group.append(piece)
            ends.append(last)
            size += len(piece)
            if size >= ENCODE_BYTES:
                yield _encode_group(group, ends, tokenizer, eos)
                group, ends, size = [], [], 0
    if group:
        yield _encode_group(group, ends, tokenizer, eos)


def _with_last(items: Iterator[str]) -> Iterator[tuple[str, bool]]:
    """Each item and whether it is the last."""
    previous = next(items)
    for item in items:
        yield previous, False
        previous = item
    yield previous, True


def _encode_group(texts: list[str], ends: list[bool], tokenizer: Tokenizer, eos: int) -> np.ndarray:
    """The ids of ``texts`` (pieces), an EOS after each that ``ends`` its document."""
    ids = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
    return np.insert(flat, np.cumsum(lengths)[np.asarray(ends, bool)], eos)


def read_split(path: Path, dtype: np.dtype, tokens: int) -> np.ndarray:
    """The split written by :func:`write_split`, memory-mapped read-only."""
    if tokens == 0:  # np.memmap cannot map an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(tokens,))
