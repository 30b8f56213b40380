"""Data as users have it: a folder of text files, a ``datasets`` save_to_disk folder (one
Dataset or a DatasetDict), Arrow files (stream and file format); each read as a source, its
cache keyed by content, and each wrong shape refused in one line that names the fix."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from dept.config import ConfigError
from dept.data.corpus import load_source_text
from dept.data.sources import SourceSpec, check_source_paths
from tests.helpers import fenced_block, with_venv_on_path

DOCS = Path(__file__).resolve().parents[3] / "docs" / "sources.md"


def _documents(count: int, word: str = "document") -> list[str]:
    return [f"{word} {i} " * 12 for i in range(count)]


def _text_folder(folder: Path) -> list[str]:
    """Text files in a folder and a subfolder, beside files that are not data."""
    texts = _documents(40)
    (folder / "part-b").mkdir(parents=True)
    (folder / "a.txt").write_text("\n\n".join(texts[:25]) + "\n")
    (folder / "part-b" / "b.txt").write_text("\n\n".join(texts[25:]) + "\n")
    (folder / "README.md").write_text("how this corpus was made\n")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "stale.txt").write_text("not data\n")
    return texts


def _read(spec: SourceSpec, cache: Path) -> tuple[list[str], list[str]]:
    check_source_paths([spec])
    text = load_source_text(spec, cache, seed=0)
    return list(text.train["text"]), list(text.validation["text"])


def test_a_folder_of_text_files_is_read_whole_with_validation_held_out(tmp_path: Path) -> None:
    texts = _text_folder(tmp_path / "notes")
    spec = SourceSpec(name="notes", path=str(tmp_path / "notes"), val_fraction=0.1)

    train, validation = _read(spec, tmp_path / "cache")

    assert spec.kind == "folder"
    assert (len(train), len(validation)) == (36, 4)
    assert sorted(t.strip() for t in train + validation) == sorted(t.strip() for t in texts)
    key = load_source_text(spec, tmp_path / "cache", seed=0).key
    shutil.move(tmp_path / "notes", tmp_path / "moved")
    moved = SourceSpec(name="notes", path=str(tmp_path / "moved"), val_fraction=0.1)
    assert load_source_text(moved, tmp_path / "cache", seed=0).key == key, "content, not path"


def test_a_folder_of_two_formats_or_none_is_refused_with_the_fix(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    _text_folder(mixed)
    (mixed / "extra.jsonl").write_text('{"text": "one"}\n')
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("nothing yet\n")
    split = tmp_path / "split"
    split.mkdir()
    (split / "train.txt").write_text("training text\n")

    with pytest.raises(ConfigError) as two:
        check_source_paths([SourceSpec(name="mixed", path=str(mixed))])
    with pytest.raises(ConfigError) as none:
        check_source_paths([SourceSpec(name="empty", path=str(empty))])
    with pytest.raises(ConfigError) as no_val:
        check_source_paths([SourceSpec(name="split", path=str(split))])

    assert str(two.value) == (
        f"source 'mixed': {mixed} holds files of several formats (1 .jsonl, 2 .txt); name the "
        f"ones to read with a glob, e.g. path: {mixed}/**/*.jsonl"
    )
    assert str(none.value) == (
        f"source 'empty': {empty} holds no data to read: no train.txt and val.txt, no datasets "
        "save_to_disk folder, no .txt/.json/.jsonl/.csv/.parquet/.arrow files"
    )
    assert str(no_val.value) == (
        f"source 'split': {split / 'val.txt'} is missing (a folder with train.txt is read as "
        "train.txt and val.txt)"
    )


def test_a_saved_dataset_is_read_with_validation_held_out(tmp_path: Path) -> None:
    texts = _documents(50)
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"body": texts, "id": list(range(50))}).save_to_disk(saved)
    spec = SourceSpec(name="saved", path=str(saved), text_column="body", val_fraction=0.2)

    train, validation = _read(spec, tmp_path / "cache")

    assert spec.kind == "saved"
    assert (len(train), len(validation)) == (40, 10)
    assert sorted(train + validation) == sorted(texts)
    wrong = SourceSpec(name="saved", path=str(saved), text_column="body", val_split="test")
    with pytest.raises(ValueError, match=r"holds one Dataset, no splits, so 'val-split'"):
        load_source_text(wrong, tmp_path / "cache", seed=0)
    with pytest.raises(ValueError) as as_hub:
        load_source_text(SourceSpec(name="s", path=f"hf:{saved}"), tmp_path / "cache", seed=0)
    assert str(as_hub.value) == (
        f"source 's': {saved} is a folder save_to_disk wrote: give it as a local path, "
        f"without 'hf:' (path: {saved})"
    )


def test_a_saved_dataset_dict_reads_its_named_splits(tmp_path: Path) -> None:
    train_texts, test_texts = _documents(30), _documents(6, "held")
    saved = tmp_path / "saved-dict"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": train_texts}),
            "test": datasets.Dataset.from_dict({"text": test_texts}),
        }
    ).save_to_disk(saved)
    spec = SourceSpec(name="dict", path=str(saved), val_split="test")

    train, validation = _read(spec, tmp_path / "cache")

    assert (train, validation) == (train_texts, test_texts), "the splits as saved, in order"
    held = load_source_text(SourceSpec(name="dict", path=str(saved)), tmp_path / "c2", seed=0)
    assert len(held.train) + len(held.validation) == 30, "no val-split: held out of train"
    missing = SourceSpec(name="dict", path=str(saved), split="training")
    with pytest.raises(ValueError) as caught:
        load_source_text(missing, tmp_path / "cache", seed=0)
    assert str(caught.value) == (
        f"source 'dict': {saved} has no split 'training' (its splits: train, test); set 'split'"
    )


@pytest.mark.parametrize("layout", ["stream", "file"])
def test_arrow_files_are_read_in_either_ipc_layout(tmp_path: Path, layout: str) -> None:
    """``datasets`` writes Arrow's stream layout; pyarrow's ``new_file`` (Feather v2) the
    file layout: both are ``.arrow`` files a user may hold."""
    folder = tmp_path / "shards"
    folder.mkdir()
    texts = _documents(60)
    for part in range(3):
        table = pa.table({"text": texts[part * 20 : (part + 1) * 20]})
        path = folder / f"part-{part}.arrow"
        with pa.OSFile(str(path), "wb") as sink:
            opened = pa.ipc.new_stream if layout == "stream" else pa.ipc.new_file
            with opened(sink, table.schema) as writer:
                writer.write_table(table)
    for spec in (
        SourceSpec(name="glob", path=str(folder / "*.arrow"), val_fraction=0.1),
        SourceSpec(name="folder", path=str(folder), val_fraction=0.1),
    ):
        train, validation = _read(spec, tmp_path / "cache")
        assert sorted(train + validation) == sorted(texts), spec.name
        assert len(validation) == 6


@pytest.mark.slow
def test_the_docs_example_makes_and_prepares_every_form(tmp_path: Path) -> None:
    script = fenced_block(DOCS, "## Data as you have it")
    env = with_venv_on_path(XDG_CACHE_HOME=str(tmp_path))

    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("notes", "saved", "shards"):
        assert f"\n{name}: " in "\n" + done.stdout, f"{name} not prepared: {done.stdout}"
    assert "3,420 validation tokens" in done.stdout.split("\nsaved: ")[1].splitlines()[0], (
        "the saved DatasetDict's test split is its validation"
    )
