"""Documents of any length in bounded pieces: pieces join back and keep words whole, the
longest document is found across read chunks, a huge document is refused in seconds and a
long one trains and tokenizes in bounded time."""

from __future__ import annotations

import random
import string
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from dept.config import load_config
from dept.data import corpus, pieces, shards
from dept.data.pieces import WORD_CHARS, longest_document, training_pieces
from dept.data.sources import load_sources
from dept.data.vocab import train_tokenizer
from dept.train.prepare import prepare_source
from tests.helpers import debug_run_config

PROSE = "the quick brown fox jumps over the lazy dog, and the  dog sleeps.\n" * 40


def test_pieces_join_back_and_cut_before_a_space() -> None:
    cut = list(pieces.pieces(PROSE, 100))
    assert "".join(cut) == PROSE and all(len(p) <= 100 for p in cut)
    assert all(p[0].isspace() for p in cut[1:]), "each piece after the first starts a word"
    assert list(pieces.pieces("abcdefghij", 4)) == ["abcd", "efgh", "ij"], "no space: hard cut"
    assert list(pieces.pieces("", 4)) == [""]
    run = "x" * (2 * WORD_CHARS + 5)
    trained = list(training_pieces(f"a {run} b"))
    assert "".join(trained) == f"a {run} b" and max(map(len, trained)) == WORD_CHARS


@pytest.mark.parametrize(
    ("content", "separator", "expected"),
    [
        (b"ab\ncdef\ng", b"\n", (4, 2)),
        (b"ab\n\ncdefgh\nij\n\nk", b"\n\n", (9, 2)),
        (b"a\n\n\nbbbb\n\n", b"\n\n", (5, 2)),
        (b"xyz", b"\n", (3, 1)),
        (b"xyz", None, (3, 1)),
    ],
)
def test_the_longest_document_is_found_across_read_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, separator, expected
) -> None:
    monkeypatch.setattr(pieces, "SCAN_BYTES", 3)  # separators straddle the reads
    path = tmp_path / "f.txt"
    path.write_bytes(content)
    assert longest_document(path, separator) == expected


def test_a_long_document_encodes_as_its_pieces_the_same_ids(tmp_path: Path) -> None:
    encoder = Tokenizer.from_file(str(train_tokenizer([PROSE], 400, tmp_path)))
    long = PROSE * 100  # 26 KiB a copy: several pieces
    got = np.concatenate(list(shards._encoded([long, "end"], encoder, eos=0)))
    whole = encoder.encode(long, add_special_tokens=False).ids
    assert got.tolist() == [*whole, 0, *encoder.encode("end").ids, 0]


def _one_line_source(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "huge"
    folder.mkdir()
    (folder / "train.txt").write_text(text)
    (folder / "val.txt").write_text(PROSE)
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"- {{name: huge, path: '{folder}', vocab-size: 600}}\n")
    return sources


def test_a_document_too_large_to_read_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus, "MAX_DOCUMENT_BYTES", 1 << 16)
    sources = _one_line_source(tmp_path, "y" * (1 << 17))
    [spec] = load_sources(sources)
    with pytest.raises(ValueError, match=r"source 'huge': .*train.txt holds a document of"):
        corpus.load_source_text(spec, tmp_path / "cache", seed=0)


@pytest.mark.timeout(120)  # whole, its tokenizer would train for minutes on one long word
def test_a_megabyte_with_no_space_trains_and_tokenizes_in_bounded_time(tmp_path: Path) -> None:
    rng = random.Random(0)
    sources = _one_line_source(tmp_path, "".join(rng.choices(string.ascii_lowercase, k=1 << 20)))
    cfg = load_config(debug_run_config(tmp_path, **{"sources-file": str(sources)}))
    [spec] = load_sources(sources)
    prepared = prepare_source(cfg, spec, tmp_path / "cache", [spec])
    assert len(prepared.tokens.train) > (1 << 20) // 8, "every byte tokenized"
