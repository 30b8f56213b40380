"""The downstream tasks built from held-out text: what dept finetune reads, balanced, made
only of validation text, the test split after the train split, the same bytes every build."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.corpora.__main__ import main
from benchmarks.corpora.tasks import (
    CHUNK_BYTES,
    TASKS,
    build_tasks,
    pieces,
    source_chunks,
    split_by_position,
)
from dept.data.sources import load_sources
from dept_cli.finetune import load_task
from tests.helpers import synthetic_sources


def test_pieces_cut_by_bytes_between_characters() -> None:
    text = "ab" * 60 + "中" * 50  # 120 one-byte characters, then 150 bytes of three each
    cut = pieces(text)

    assert "".join(cut) == text
    assert all(len(p.encode()) < CHUNK_BYTES + 3 for p in cut)
    assert len(cut[0]) == CHUNK_BYTES and len(cut[-1]) < len(cut[1])


def test_every_task_is_balanced_made_of_validation_text_and_rebuilt_bit_for_bit(
    tmp_path: Path,
) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek", "cyrillic")

    assert main(["build-tasks", str(tmp_path / "a"), "--sources-file", str(sources),
                 "--train", "60", "--test", "30"]) == 0  # fmt: skip
    again = build_tasks(sources, tmp_path / "b", train=60, test=30)

    manifest = json.loads((tmp_path / "a" / "tasks.json").read_text())
    assert manifest["sha256"] == again["sha256"] and len(manifest["sha256"]) == 2 * len(TASKS)
    for task in TASKS:
        loaded = load_task(tmp_path / "a" / task)
        assert (len(loaded.train), len(loaded.test)) == (60, 30) and not loaded.regression
        counts = Counter(label for _, label in loaded.train)
        assert max(counts.values()) - min(counts.values()) <= 1, (task, counts)
    # every chunk is validation text, the test split's from after the train split's
    held_out = {
        spec.name: split_by_position(source_chunks(spec, tmp_path / "a" / ".cache", 0))
        for spec in load_sources(sources)
    }
    for split, index in (("train", 0), ("test", 1)):
        allowed = {c for parts in held_out.values() for c in parts[index]}
        for task in TASKS:
            rows = load_task(tmp_path / "a" / task)
            for texts, _ in rows.train if split == "train" else rows.test:
                assert set(texts) <= allowed, (task, split, texts)
    which = load_task(tmp_path / "a" / "which-source")
    assert which.num_labels == 3 and manifest["which_source_labels"] == [
        "synth-cyrillic",
        "synth-greek",
        "synth-latin",
    ]


def test_too_little_text_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "tiny-source"
    folder.mkdir()
    (folder / "train.txt").write_text("some training text\n" * 50)
    (folder / "val.txt").write_text("short\n")
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"- {{name: tiny, path: {folder}}}\n")

    with pytest.raises(ValueError, match="too little validation text to make tasks from: tiny"):
        build_tasks(sources, tmp_path / "out", train=4, test=2)
