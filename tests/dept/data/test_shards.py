import json
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
from tokenizers import Tokenizer

import dept.data.shards
from dept.data.shards import (
    Plan,
    read_split,
    recorded_ranges,
    token_dtype,
    tokenized_splits,
    write_split,
)
from dept.data.vocab import load_tokenizer, train_tokenizer

DOCS = [f"Dokument {i}: Grüße aus Köln, {'Москва ' * (i % 7)}ende." for i in range(230)]
PLAN = Plan(rows_per_batch=10, batches_per_shard=2)  # 12 shards of 20 documents


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = train_tokenizer(DOCS, 400, tmp_path_factory.mktemp("tok"))
    return load_tokenizer(path).backend_tokenizer


class Counting:
    """A tokenizer that counts the documents it encodes."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner, self.documents = inner, 0

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> list:
        self.documents += len(texts)
        return self.inner.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    def get_vocab_size(self, with_added_tokens: bool) -> int:
        return self.inner.get_vocab_size(with_added_tokens=with_added_tokens)


def _table() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": DOCS})


UINT16 = np.dtype(np.uint16)


def _read(path: Path, dtype: np.dtype = UINT16) -> np.ndarray:
    return read_split(path, dtype, path.stat().st_size // dtype.itemsize)


def test_the_stream_is_each_document_then_eos_across_shards(
    tmp_path: Path, encoder: Tokenizer
) -> None:
    write_split(_table(), encoder, 0, tmp_path / "train.bin", PLAN)
    expected = np.concatenate([[*encoder.encode(d, add_special_tokens=False).ids, 0] for d in DOCS])
    tokens = _read(tmp_path / "train.bin")
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16
    assert np.array_equal(tokens, expected)
    assert not list(tmp_path.glob("*.json")) and not list(tmp_path.glob(".*")), "no leftovers"


def test_a_killed_preparation_continues_and_ends_as_an_uninterrupted_one(
    tmp_path: Path, encoder: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_split(_table(), encoder, 0, tmp_path / "whole.bin", PLAN)
    commit = dept.data.shards._commit
    commits = []

    def dies_after_five(path: Path, done: dict[str, int]) -> None:
        if len(commits) == 5:
            raise KeyboardInterrupt("killed")
        commits.append(done["shards"])
        commit(path, done)

    monkeypatch.setattr(dept.data.shards, "_commit", dies_after_five)
    with pytest.raises(KeyboardInterrupt):
        write_split(_table(), encoder, 0, tmp_path / "train.bin", PLAN)
    monkeypatch.setattr(dept.data.shards, "_commit", commit)
    partial = tmp_path / ".train.bin.partial"
    with partial.open("ab") as out:  # the sixth shard was half written when it died
        out.write(b"\x07" * 333)
    counting = Counting(encoder)
    write_split(_table(), counting, 0, tmp_path / "train.bin", PLAN)  # type: ignore[arg-type]
    assert counting.documents == len(DOCS) - 5 * PLAN.rows_per_shard, "shards 0-4 not redone"
    assert np.array_equal(_read(tmp_path / "train.bin"), _read(tmp_path / "whole.bin"))


def test_another_plan_starts_over(tmp_path: Path, encoder: Tokenizer) -> None:
    (tmp_path / ".train.bin.partial").write_bytes(b"\x01" * 64)
    (tmp_path / "progress-train.json").write_text(
        '{"shards": 1, "tokens": 32, "rows_per_shard": 7}'
    )
    write_split(_table(), encoder, 0, tmp_path / "train.bin", PLAN)
    write_split(_table(), encoder, 0, tmp_path / "fresh.bin", PLAN)
    assert np.array_equal(_read(tmp_path / "train.bin"), _read(tmp_path / "fresh.bin"))


def test_ids_past_uint16_are_stored_as_uint32(tmp_path: Path) -> None:
    assert token_dtype(1 << 16) == np.uint16 and token_dtype((1 << 16) + 1) == np.uint32
    big = SimpleNamespace(
        get_vocab_size=lambda with_added_tokens: 70_000,
        encode_batch_fast=lambda texts, add_special_tokens: [
            SimpleNamespace(ids=[69_999, len(t)]) for t in texts
        ],
    )
    write_split(_table(), big, 1, tmp_path / "train.bin", PLAN)  # type: ignore[arg-type]
    tokens = _read(tmp_path / "train.bin", np.dtype(np.uint32))
    assert tokens[:3].tolist() == [69_999, len(DOCS[0]), 1]
    assert len(tokens) == 3 * len(DOCS)


def test_splits_are_written_once_and_mapped_after(tmp_path: Path, encoder: Tokenizer) -> None:
    tables = {"train": _table(), "validation": _table().select(range(5))}
    first = tokenized_splits(tables, encoder, 0, tmp_path / "tokens")
    stamp = (tmp_path / "tokens" / "train.bin").stat().st_mtime_ns
    again = tokenized_splits(tables, encoder, 0, tmp_path / "tokens")
    assert (tmp_path / "tokens" / "train.bin").stat().st_mtime_ns == stamp
    assert np.array_equal(first["train"], again["train"])
    assert (first["validation"] == 0).sum() == 5
    assert not encoder.encode_special_tokens, "the caller's tokenizer is left as it was"


def test_an_empty_split_reads_as_no_tokens(tmp_path: Path) -> None:
    assert len(read_split(tmp_path / "none.bin", np.dtype(np.uint16), 0)) == 0


def test_each_splits_id_range_is_recorded_once_with_the_cache(
    tmp_path: Path, encoder: Tokenizer
) -> None:
    tables = {"train": _table(), "validation": _table().select(range(5))}
    splits = tokenized_splits(tables, encoder, 0, tmp_path / "tokens")
    ranges = recorded_ranges(tmp_path / "tokens")
    assert ranges == {s: (int(v.min()), int(v.max())) for s, v in splits.items()}
    # An older cache without them gets them on its next read, then keeps them.
    meta = tmp_path / "tokens" / "meta.json"
    written = json.loads(meta.read_text())
    meta.write_text(json.dumps({k: v for k, v in written.items() if k != "ranges"}))
    tokenized_splits(tables, encoder, 0, tmp_path / "tokens")
    assert recorded_ranges(tmp_path / "tokens") == ranges
