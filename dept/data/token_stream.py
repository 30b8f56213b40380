"""A source's tokens: tokenized once, packed into blocks, and batched in a seeded order
that goes on where it stopped.

Documents are tokenized, joined with an EOS after each, and cut into fixed-length blocks
(``seq_len + 1`` tokens, so every block yields ``seq_len`` next-token targets). The stream is
written to disk shard by shard and read by memory map (:mod:`dept.data.shards`), in a cache
next to the source's state keyed by the tokenizer and the documents (not their path), so no
round re-tokenizes and memory does not grow with the source. Training walks a seeded
permutation of the blocks and remembers where it stopped (:class:`StreamPosition`), so the
next round continues instead of restarting. Reading the documents is :mod:`dept.data.corpus`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock
from transformers import PreTrainedTokenizerFast

from dept.data.corpus import SourceText
from dept.data.fingerprint import digest
from dept.data.shards import recorded_ranges, tokenized_splits

TOKENS_FORMAT = 2  # 1: one .npz of int32 per source; 2: memory-mapped shards (dept.data.shards)


@dataclass
class TokenizedSource:
    """A source's token stream per split (documents joined, EOS after each)."""

    train: np.ndarray  # (N_train,) token ids, uint16 or uint32, memory-mapped
    validation: np.ndarray  # (N_val,) token ids, likewise
    # per split (min, max) id, recorded when the cache was written; None: not known
    id_ranges: dict[str, tuple[int, int]] | None = None


def tokenize_source(
    text: SourceText, tokenizer: PreTrainedTokenizerFast, tokenizer_digest: str, cache_dir: Path
) -> TokenizedSource:
    """Tokenize both splits once, resuming an interrupted preparation; later calls with the
    same tokenizer and data map the cache."""
    folder = cache_dir / f"tokens-{digest(tokenizer_digest, text.key, TOKENS_FORMAT)}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        splits = tokenized_splits(
            {"train": text.train, "validation": text.validation},
            tokenizer.backend_tokenizer,
            tokenizer.eos_token_id,
            folder,
        )
        ranges = recorded_ranges(folder)
    return TokenizedSource(splits["train"], splits["validation"], ranges)


def num_blocks(tokens: np.ndarray, seq_len: int) -> int:
    """How many ``seq_len + 1`` blocks (stride ``seq_len``) the stream holds."""
    return max(0, (len(tokens) - 1) // seq_len)


def block(tokens: np.ndarray, index: int, seq_len: int) -> np.ndarray:
    start = index * seq_len
    return tokens[start : start + seq_len + 1]


@dataclass
class StreamPosition:
    """Where a source's training stream stands: epoch of the permutation and offset in it."""

    epoch: int = 0
    offset: int = 0


def training_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, position: StreamPosition
) -> Iterator[np.ndarray]:
    """Endless (B, seq_len + 1) batches in a seeded order per epoch, advancing ``position``."""
    n = num_blocks(tokens, seq_len)
    if n < batch_size:
        raise ValueError(
            f"the training text has {len(tokens)} tokens: fewer than one batch "
            f"of {batch_size} x {seq_len + 1}"
        )
    while True:
        order = np.random.default_rng([seed, position.epoch]).permutation(n)
        while position.offset < n:
            take = order[position.offset : position.offset + batch_size]
            if len(take) < batch_size:  # the last partial batch of an epoch is skipped
                break
            position.offset += batch_size
            yield np.stack([block(tokens, int(i), seq_len) for i in take]).astype(np.int32)
        position.epoch, position.offset = position.epoch + 1, 0
