from pathlib import Path

import numpy as np
import pytest

import dept.data.vocab
from dept.config import MIN_VOCAB_SIZE
from dept.data.token_ids import check_token_ids
from dept.data.token_stream import TokenizedSource
from dept.data.vocab import (
    EOS_TOKEN,
    SPECIAL_TOKENS,
    VocabMap,
    ensure_tokenizer,
    load_tokenizer,
    source_vocabulary,
    token_byte_lengths,
    train_tokenizer,
)

TEXTS = ["Grüße aus Köln, 東京 and Москва!", "def f(x):\n    return x ** 2\n"] * 50


def test_trained_tokenizer_round_trips_any_script(tmp_path: Path) -> None:
    path = train_tokenizer(TEXTS, 400, tmp_path)
    tok = load_tokenizer(path)
    assert len(tok) <= 400 and tok.eos_token == EOS_TOKEN
    for text in TEXTS[:2]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text


def test_token_byte_lengths_sum_to_utf8_bytes(tmp_path: Path) -> None:
    tok = load_tokenizer(train_tokenizer(TEXTS, 400, tmp_path))
    lengths = token_byte_lengths(tok)
    for text in TEXTS[:2]:
        ids = tok.encode(text, add_special_tokens=False)
        assert lengths[ids].sum() == len(text.encode("utf-8"))
    assert lengths[tok.eos_token_id] == 1


def test_ensure_tokenizer_trains_once(tmp_path: Path) -> None:
    path = ensure_tokenizer(tmp_path / "t", 400, iter(TEXTS))
    stamp = path.stat().st_mtime_ns
    again = ensure_tokenizer(tmp_path / "t", 400, iter(["never used"]))
    assert again == path and path.stat().st_mtime_ns == stamp


def test_a_cached_tokenizer_swapped_for_another_is_refused_by_name(tmp_path: Path) -> None:
    path = ensure_tokenizer(tmp_path / "own", 400, iter(TEXTS))
    other = train_tokenizer(TEXTS[:1] * 10, 300, tmp_path / "other")
    path.write_bytes(other.read_bytes())  # a file put in the cache by hand
    with pytest.raises(ValueError, match=rf"cached tokenizer {path} is not the one trained"):
        ensure_tokenizer(tmp_path / "own", 400, iter(TEXTS))


def test_a_cached_tokenizer_larger_than_its_size_is_refused(tmp_path: Path) -> None:
    big = train_tokenizer(TEXTS * 4, 1000, tmp_path / "big")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tokenizer.json").write_bytes(big.read_bytes())  # an old cache: no digest kept
    with pytest.raises(ValueError, match=r"has \d+ tokens, more than the 300 it was trained for"):
        ensure_tokenizer(cache, 300, iter(TEXTS))


def test_vocab_size_too_small(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vocab-size"):
        train_tokenizer(TEXTS, 100, tmp_path)


def test_vocab_map_keeps_used_ids_and_one_other_row(tmp_path: Path) -> None:
    tok = load_tokenizer(train_tokenizer(TEXTS, 400, tmp_path))
    train_ids = np.asarray(tok.encode(TEXTS[1], add_special_tokens=False))
    kept = source_vocabulary(train_ids, tok)
    assert tok.eos_token_id in kept and len(kept) < len(tok)
    vmap = VocabMap(kept, len(tok))
    assert vmap.local_vocab_size == len(kept) + 1
    assert np.array_equal(vmap.kept_ids[vmap.to_local(train_ids)], train_ids)
    outside = np.setdiff1d(np.arange(len(tok)), kept)[:3]
    assert (vmap.to_local(outside) == vmap.other_row).all()
    assert vmap.num_outside == len(tok) - len(kept)


def test_source_vocabulary_counts_a_mapped_stream_chunk_by_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dept.data.vocab, "VOCAB_CHUNK", 7)
    tok = load_tokenizer(train_tokenizer(TEXTS, 400, tmp_path))
    ids = np.asarray(tok.encode(" ".join(TEXTS[:2]), add_special_tokens=False), dtype=np.uint16)
    ids.tofile(tmp_path / "train.bin")
    mapped = np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r")
    expected = np.union1d(np.unique(ids), tok.all_special_ids)
    assert np.array_equal(source_vocabulary(mapped, tok), expected)


class Unread(np.ndarray):
    """A token stream that must not be read: the recorded range stands for it."""

    def min(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise AssertionError("the stream was scanned")

    max = min


def test_token_ids_are_checked_by_the_recorded_range_not_by_reading_the_stream() -> None:
    stream = np.zeros(10, dtype=np.uint16).view(Unread)
    fine = TokenizedSource(stream, stream, {"train": (0, 99), "validation": (3, 7)})
    check_token_ids("s", fine, 100, Path("tok.json"))
    past = TokenizedSource(stream, np.array([1, 100, 2]), {"train": (0, 9), "validation": (1, 100)})
    with pytest.raises(ValueError, match="token id 100 in its validation tokens"):
        check_token_ids("s", past, 100, Path("tok.json"))


def test_the_smallest_vocabulary_is_the_bytes_the_special_tokens_and_one_merge() -> None:
    assert 256 + len(SPECIAL_TOKENS) + 1 == MIN_VOCAB_SIZE
