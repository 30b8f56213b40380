"""Tokenizers: training (per source for SPEC-OPT, global for SPEC), loading, and V_k.

All tokenizers are byte-level BPE, so every source (any script, code included) is encoded
without unknown tokens and each token maps to an exact number of UTF-8 bytes, which is what
bits-per-byte needs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from filelock import FileLock
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from dept.config import MIN_VOCAB_SIZE

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN,)
TOKENIZER_FILE = "tokenizer.json"
DIGEST_FILE = "tokenizer.sha256"  # beside a cached tokenizer: the digest of the one trained
VOCAB_CHUNK = 1 << 22  # token ids counted at a time when finding V_k


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: Path) -> Path:
    """Train a byte-level BPE tokenizer on ``texts`` and write ``out_dir/tokenizer.json``.

    ``texts`` must be bounded by the caller (:func:`dept.data.corpus.text_sample`): the trainer
    holds what it has read."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab-size {vocab_size} is below the minimum {MIN_VOCAB_SIZE}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TOKENIZER_FILE
    tmp = path.with_suffix(".tmp")
    tokenizer.save(str(tmp))
    tmp.replace(path)
    return path


def ensure_tokenizer(out_dir: Path, vocab_size: int, texts: Iterable[str]) -> Path:
    """Return ``out_dir/tokenizer.json``, training it first if absent (once, under a file
    lock). A cached one is used only if it is the file trained here (its digest, written
    beside it) and no larger than ``vocab_size``: a file swapped into the cache is refused
    by name, not trained with."""
    path = out_dir / TOKENIZER_FILE
    out_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir / ".lock")):
        if not path.is_file():
            train_tokenizer(texts, vocab_size, out_dir)
            (out_dir / DIGEST_FILE).write_text(tokenizer_digest(path) + "\n")
        check_cached(path, vocab_size)
    return path


def check_cached(path: Path, vocab_size: int) -> None:
    """A cached tokenizer must be the one trained there and fit ``vocab_size``; else a
    :class:`ValueError` naming it and how to have it trained again."""
    again = f"remove {path.parent} to train it again"
    record = path.parent / DIGEST_FILE
    found = tokenizer_digest(path)
    if record.is_file() and record.read_text().strip() != found:
        raise ValueError(
            f"the cached tokenizer {path} is not the one trained there (its digest is {found}, "
            f"{record.name} says {record.read_text().strip()}): {again}"
        )
    size = len(load_tokenizer(path))
    if size > vocab_size:
        raise ValueError(
            f"the cached tokenizer {path} has {size} tokens, more than the {vocab_size} it was "
            f"trained for: {again}"
        )
    if not record.is_file():  # cached before digests were kept: it fits, so keep it
        record.write_text(found + "\n")


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """Load a trained ``tokenizer.json`` as a transformers fast tokenizer."""
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist")
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOS_TOKEN)


def check_fits(tokenizer: PreTrainedTokenizerFast, path: Path, rows: int) -> None:
    """A global tokenizer has at most ``global-vocab-size`` tokens: its ids index the rows
    of the global φ (GLOB, TRIM) and every run of one config means one vocabulary (SPEC)."""
    if len(tokenizer) > rows:
        raise ValueError(
            f"the global tokenizer {path} has {len(tokenizer)} tokens, more than config key "
            f"'global-vocab-size' ({rows}) rows"
        )


def tokenizer_digest(path: Path) -> str:
    """Short content hash, used to key caches built with this tokenizer."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def token_byte_lengths(tokenizer: PreTrainedTokenizerFast) -> np.ndarray:
    """UTF-8 bytes each token id stands for (byte-level BPE: one symbol = one byte).

    The EOS token counts as one byte: it stands for the boundary between two documents.
    Other special tokens count zero.
    """
    vocab = tokenizer.get_vocab()
    lengths = np.zeros(len(tokenizer), dtype=np.int64)
    specials = set(tokenizer.all_special_tokens)
    for token, idx in vocab.items():
        lengths[idx] = 0 if token in specials else len(token)
    lengths[tokenizer.convert_tokens_to_ids(EOS_TOKEN)] = 1
    return lengths


def source_vocabulary(train_ids: np.ndarray, tokenizer: PreTrainedTokenizerFast) -> np.ndarray:
    """V_k: the sorted global ids that occur in a source's training tokens, plus specials.

    Counted chunk by chunk, so a memory-mapped stream of any length is never loaded whole.
    """
    seen = np.zeros(len(tokenizer), dtype=bool)
    for start in range(0, len(train_ids), VOCAB_CHUNK):
        counts = np.bincount(train_ids[start : start + VOCAB_CHUNK], minlength=len(seen))
        seen |= counts[: len(seen)] > 0
    seen[np.asarray(tokenizer.all_special_ids, dtype=np.int64)] = True
    return np.flatnonzero(seen).astype(np.int64)


class VocabMap:
    """Maps global token ids to rows of a source's own embedding matrix (SPEC).

    Rows 0..|V_k|-1 hold V_k in order; one extra last row stands for every global id outside
    V_k, so validation text with unseen tokens still gets a proper probability: the row's
    logit counts once per id it stands for (:attr:`other_log_count`), and the mass on it is
    shared uniformly among those ``num_outside`` ids.
    """

    def __init__(self, kept_ids: np.ndarray, global_vocab_size: int) -> None:
        self.kept_ids = np.asarray(kept_ids, dtype=np.int64)
        self.global_vocab_size = global_vocab_size
        self.other_row = len(self.kept_ids)
        self.num_outside = global_vocab_size - len(self.kept_ids)
        self._to_local = np.full(global_vocab_size, self.other_row, dtype=np.int64)
        self._to_local[self.kept_ids] = np.arange(len(self.kept_ids))

    @property
    def local_vocab_size(self) -> int:
        return len(self.kept_ids) + 1

    @property
    def other_log_count(self) -> float:
        """log N_out, what the "other" row's logit gains in the softmax (see
        :func:`dept.train.local.next_token_logits`); -inf where V_k is the whole vocabulary, as the
        row then stands for no id at all."""
        return math.log(self.num_outside) if self.num_outside else -math.inf

    def to_local(self, global_ids: np.ndarray) -> np.ndarray:
        return self._to_local[global_ids]
