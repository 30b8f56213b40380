"""MosaicML MDS shards as a source: read as MosaicML's own reader reads them, every codec,
split folders, one shard at a time, and every wrong shape refused in one line.

The folders beside this file were written by ``MDSWriter`` and read back by
``StreamingDataset`` (``mds/make_shards.py``; ``read_back.json`` holds what it read)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from dept.config import ConfigError
from dept.data import mds
from dept.data.corpus import load_source_text
from dept.data.sources import SourceSpec, check_source_paths, load_sources
from tests.helpers import fenced_block

SHARDS = Path(__file__).parent / "mds"
READ_BACK = json.loads((SHARDS / "read_back.json").read_text(encoding="utf-8"))
DOCS = Path(__file__).resolve().parents[3] / "docs" / "sources.md"


@pytest.mark.parametrize("folder", sorted(READ_BACK))
def test_every_folder_reads_as_mosaicmls_reader_reads_it(folder: str) -> None:
    texts = [row["text"] for row in mds.texts(str(SHARDS / folder), "text")]

    assert texts == READ_BACK[folder]
    assert len(mds.shards(SHARDS / folder)) > 1 or folder == "splits/val", "several shards"


def test_one_mds_folder_is_a_source_with_validation_held_out(tmp_path: Path) -> None:
    spec = SourceSpec(name="c4", path=str(SHARDS / "plain"), val_fraction=0.1)
    check_source_paths([spec])

    text = load_source_text(spec, tmp_path / "cache", seed=0)

    assert spec.kind == "mds"
    assert (len(text.train), len(text.validation)) == (108, 12)
    read = list(text.train["text"]) + list(text.validation["text"])
    assert sorted(read) == sorted(READ_BACK["plain"])


def test_split_folders_read_their_train_and_val_splits(tmp_path: Path) -> None:
    spec = SourceSpec(name="c4", path=str(SHARDS / "splits"), val_split="val")
    check_source_paths([spec])

    text = load_source_text(spec, tmp_path / "cache", seed=0)

    assert spec.kind == "mds"
    assert list(text.train["text"]) == READ_BACK["splits/train"], "the split, in order"
    assert list(text.validation["text"]) == READ_BACK["splits/val"]
    held = load_source_text(SourceSpec(name="c4", path=str(SHARDS / "splits")), tmp_path / "c", 0)
    assert len(held.train) + len(held.validation) == 120, "no val-split: held out of train"


def test_the_docs_entry_reads_as_printed(tmp_path: Path) -> None:
    shutil.copytree(SHARDS / "splits", tmp_path / "my-copy-of-c4")
    (tmp_path / "sources.yaml").write_text(fenced_block(DOCS, "### MDS shards", "yaml"))

    (spec,) = load_sources(tmp_path / "sources.yaml")
    check_source_paths([spec])
    text = load_source_text(spec, tmp_path / "cache", seed=0)

    assert (spec.split, spec.val_split, spec.vocab_size) == ("train", "val", 8192)
    assert list(text.validation["text"]) == READ_BACK["splits/val"]


def test_shards_are_read_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source's first documents need its first shard only: memory follows one shard."""
    opened: list[str] = []
    decompress = mds._decompress

    def counted(shard: mds.Shard) -> bytes:
        opened.append(shard.file.name)
        return decompress(shard)

    monkeypatch.setattr(mds, "_decompress", counted)
    rows = mds.texts(str(SHARDS / "plain"), "text")
    next(rows)

    assert opened == ["shard.00000.mds"]


def _refusal(spec: SourceSpec) -> str:
    with pytest.raises(ConfigError) as caught:
        check_source_paths([spec])
    return str(caught.value)


def test_a_column_that_is_missing_or_not_text_is_refused_with_the_fix() -> None:
    tokens, plain = SHARDS / "tokens", SHARDS / "plain"

    assert _refusal(SourceSpec(name="t", path=str(tokens))) == (
        f"source 't': no column 'text' in {tokens} (columns: tokens (ndarray:int32)); "
        "set 'text-column'"
    )
    assert _refusal(SourceSpec(name="t", path=str(tokens), text_column="tokens")) == (
        f"source 't': column 'tokens' of {tokens} is ndarray:int32, not text (str): each "
        "source tokenizes text with its own vocabulary, so shards of another tokenizer's ids "
        "cannot be read; write the text as a str column"
    )
    assert _refusal(SourceSpec(name="p", path=str(plain), text_column="id")).startswith(
        f"source 'p': column 'id' of {plain} is int, not text (str)"
    )


def test_a_split_that_is_not_there_is_refused_naming_the_splits() -> None:
    splits, plain = SHARDS / "splits", SHARDS / "plain"

    assert _refusal(SourceSpec(name="s", path=str(splits), split="training")) == (
        f"source 's': {splits} has no MDS split 'training' (its splits: train, val); set 'split'"
    )
    assert _refusal(SourceSpec(name="p", path=str(plain), val_split="val")) == (
        f"source 'p': {plain} has no MDS split 'val' (it is one MDS folder, no splits); "
        "set 'val-split'"
    )


def test_a_missing_or_cut_shard_is_refused_before_reading(tmp_path: Path) -> None:
    copy = tmp_path / "c4"
    shutil.copytree(SHARDS / "compressed" / "zstd", copy)
    cut = copy / "shard.00001.mds.zstd"
    cut.write_bytes(cut.read_bytes()[:100])
    size = json.loads((copy / "index.json").read_text())["shards"][1]["zip_data"]["bytes"]

    assert _refusal(SourceSpec(name="c", path=str(copy))) == (
        f"source 'c': {cut} has 100 bytes, its index says {size:,}: cut short?"
    )
    cut.unlink()
    assert _refusal(SourceSpec(name="c", path=str(copy))) == (
        f"source 'c': {cut} is missing ({copy / 'index.json'}, shard 1 lists it)"
    )


def test_a_codec_without_the_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cramjam", None)  # as where the extra is not installed
    folder = SHARDS / "compressed" / "zstd"

    with pytest.raises(mds.MdsError) as caught:
        next(mds.texts(str(folder), "text"))
    assert str(caught.value) == (
        f"{folder / 'shard.00000.mds.zstd'} is compressed with zstd: "
        "pip install 'dept-flower[mds]' reads it"
    )
    assert [r["text"] for r in mds.texts(str(SHARDS / "compressed" / "gz"), "text")] == READ_BACK[
        "compressed/gz"
    ], "gz needs no extra"


def test_a_folder_with_some_other_index_json_is_not_mds(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text(json.dumps({"pages": ["a", "b"]}))
    (tmp_path / "a.txt").write_text("some text\n")

    assert SourceSpec(name="f", path=str(tmp_path)).kind == "folder"


def test_a_damaged_shard_is_named_when_read(tmp_path: Path) -> None:
    """Its size as listed, its bytes not: found when read, and named with the file."""
    for codec, damaged in (("zstd", "cannot be decompressed as zstd"), ("gz", "gz")):
        copy = tmp_path / codec
        shutil.copytree(SHARDS / "compressed" / codec, copy)
        shard = copy / f"shard.00000.mds.{codec}"
        data = bytearray(shard.read_bytes())
        data[10:30] = bytes(20)
        shard.write_bytes(bytes(data))

        with pytest.raises(mds.MdsError) as caught:
            list(mds.texts(str(copy), "text"))
        assert str(caught.value).startswith(f"{shard} "), caught.value
        assert damaged in str(caught.value)
    plain = tmp_path / "plain"
    shutil.copytree(SHARDS / "plain", plain)
    first = plain / "shard.00000.mds"
    original = first.read_bytes()
    first.write_bytes(b"\x05\x00\x00\x00" + original[4:])
    with pytest.raises(mds.MdsError, match=r"shard.00000.mds holds 5 samples, its index says"):
        list(mds.texts(str(plain), "text"))
    first.write_bytes(b"\xff\xff\x00\x00" + original[4:])
    with pytest.raises(mds.MdsError, match="is damaged: its sample offsets are cut short"):
        list(mds.texts(str(plain), "text"))
