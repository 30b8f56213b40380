import sys
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import dept.data.arrow_text
from dept.data.arrow_text import NOT_WHITESPACE, Rows, batches, held_out, scan, write
from dept.data.corpus import load_source_text, text_sample
from dept.data.sources import SourceSpec

DOCS = [f"doc {i} " + "ü" * (i % 17) + " x" * (i % 23) for i in range(500)]


def _written(tmp_path: Path, ids: np.ndarray, table: datasets.Dataset) -> list[str]:
    rows = scan(table, "text").take(ids)
    write(rows, tmp_path / "out.arrow")
    return datasets.Dataset.from_file(str(tmp_path / "out.arrow"))["text"][:]


def test_whitespace_is_what_str_isspace_says() -> None:
    chars = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    non_blank = pc.match_substring_regex(pa.array(chars), NOT_WHITESPACE).to_pylist()
    assert non_blank == [not c.isspace() for c in chars]


@pytest.mark.parametrize(("n", "fraction", "seed"), [(10, 0.1, 0), (999, 0.05, 3), (57, 0.5, 1)])
def test_held_out_rows_are_the_ones_datasets_picks(n: int, fraction: float, seed: int) -> None:
    table = datasets.Dataset.from_dict({"i": list(range(n))})
    parts = table.train_test_split(test_size=fraction, seed=seed, shuffle=True)
    train, validation = held_out(n, fraction, seed)
    assert train.tolist() == parts["train"]["i"][:] and validation.tolist() == parts["test"]["i"][:]


def test_rows_in_any_order_are_written_in_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dept.data.arrow_text, "BUCKET_BYTES", 2_000)  # many buckets
    monkeypatch.setattr(dept.data.arrow_text, "RECORD_BYTES", 1_000)  # many record batches
    path = tmp_path / "docs.parquet"
    datasets.Dataset.from_dict({"text": DOCS}).to_parquet(str(path))
    on_disk = datasets.load_dataset("parquet", data_files=str(path), cache_dir=str(tmp_path))
    shuffled = np.random.default_rng(0).permutation(len(DOCS))[:400]
    for table in (datasets.Dataset.from_dict({"text": DOCS}), on_disk["train"]):
        assert _written(tmp_path, shuffled, table) == [DOCS[i] for i in shuffled]
        assert _written(tmp_path, np.arange(3, 300), table) == DOCS[3:300]


def test_blank_rows_are_dropped_and_batches_cut_at_any_row() -> None:
    table = datasets.Dataset.from_dict({"text": ["a", " \u3000\n", None, "b ", "", "\x1cc"]})
    rows = scan(table, "text")
    assert rows.ids.tolist() == [0, 3, 5] and rows.sizes.tolist() == [1, 2, 2]
    assert isinstance(rows, Rows) and rows.capped(3).ids.tolist() == [0]
    texts = datasets.Dataset.from_dict({"text": DOCS})
    pieces = [b.to_pylist() for b in batches(texts, 7, 100)]
    assert [len(p) for p in pieces] == [100] * 4 + [93]
    assert [t for p in pieces for t in p] == DOCS[7:]


def _arrow_resident_kib() -> int:
    """Resident KiB of this process's mappings of ``.arrow`` files."""
    total, mapped = 0, ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and ":" not in fields[0]:
            mapped = fields[-1]
        elif line.startswith("Rss:") and mapped.endswith(".arrow"):
            total += int(fields[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="reads /proc (Linux)")
def test_passes_over_the_text_leave_no_pages_of_it_resident(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    words = np.random.default_rng(0).integers(0, 10**6, size=1_200_000).astype(str)
    (folder / "train.txt").write_text(
        "\n\n".join(" ".join(words[i : i + 60]) for i in range(0, len(words), 60))
    )
    (folder / "val.txt").write_text("a few words\n")
    text = load_source_text(SourceSpec(name="s", path=str(folder)), tmp_path / "c", 0)
    size = sum(len(t) for t in batches(text.train, 0, 1000))
    assert sum(len(t.encode()) for t in text_sample(text.train, 10**9, 0)) > 8_000_000
    assert sum(len(t) for t in batches(text.train, 0, 1000)) == size
    assert _arrow_resident_kib() < 1_000, "plain reads: the page cache holds the text"
    pc.utf8_length(text.train.with_format("arrow")[:]["text"])  # datasets' table: mapped
    assert _arrow_resident_kib() > 4_000, "the measurement sees mapped pages"
