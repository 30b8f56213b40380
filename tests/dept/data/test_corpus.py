import json
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pytest
from datasets.exceptions import DatasetGenerationError

import dept.data.shards
from dept.data.corpus import SourceText, load_source_text, text_sample
from dept.data.sources import SourceSpec, check_source_paths
from dept.data.synthetic import SCRIPTS, ensure_synthetic_corpus, make_grammar, oracle_bpb
from dept.data.token_stream import (
    StreamPosition,
    block,
    num_blocks,
    tokenize_source,
    training_batches,
)
from dept.data.vocab import load_tokenizer, tokenizer_digest, train_tokenizer
from tests.helpers import corpus


def test_blocks_overlap_by_one_token() -> None:
    tokens = np.arange(10, dtype=np.int32)
    assert num_blocks(tokens, 3) == 3
    assert block(tokens, 1, 3).tolist() == [3, 4, 5, 6]


def test_batches_are_deterministic_and_continue_where_they_stopped() -> None:
    tokens = np.arange(1000, dtype=np.int32)
    first = StreamPosition()
    run = training_batches(tokens, 9, 4, seed=1, position=first)
    a = [next(run) for _ in range(5)]
    resumed = training_batches(tokens, 9, 4, seed=1, position=StreamPosition(**vars(first)))
    b = [next(resumed) for _ in range(3)]
    fresh = training_batches(tokens, 9, 4, seed=1, position=StreamPosition())
    assert all(
        np.array_equal(x, y) for x, y in zip(a, [next(fresh) for _ in range(5)], strict=True)
    )
    starts = {int(batch[i, 0]) for batch in a + b for i in range(4)}
    assert len(starts) == 32, "no block is repeated within an epoch"
    assert a[0].shape == (4, 10)


def test_epochs_wrap_with_a_new_order() -> None:
    tokens = np.arange(100, dtype=np.int32)
    position = StreamPosition()
    batches = training_batches(tokens, 9, 5, seed=0, position=position)
    epoch0 = [next(batches) for _ in range(2)]
    epoch1 = next(batches)
    assert position.epoch == 1
    assert not np.array_equal(epoch0[0], epoch1)


def test_too_little_text_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="fewer than one batch"):
        next(training_batches(np.arange(20, dtype=np.int32), 9, 4, 0, StreamPosition()))


def test_directory_source_reads_shared_corpus(tmp_path: Path) -> None:
    folder = corpus("de-novels")
    spec = SourceSpec(name="de", path=str(folder))
    text = load_source_text(spec, tmp_path, seed=0)
    assert len(text.train) > 100 and len(text.validation) > 10
    assert text.train[0]["text"].strip()


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_file_sources_hold_out_validation(tmp_path: Path, suffix: str) -> None:
    rows = [{"body": f"document {i} " * 20} for i in range(200)]
    path = tmp_path / f"docs{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    spec = SourceSpec(name="docs", path=str(path), text_column="body", val_fraction=0.1)
    text = load_source_text(spec, tmp_path / "cache", seed=0)
    assert (len(text.train), len(text.validation)) == (180, 20)
    bad = SourceSpec(name="docs", path=str(path), text_column="missing")
    with pytest.raises(ValueError, match="text-column"):
        load_source_text(bad, tmp_path / "cache", seed=0)


def test_a_source_of_one_document_is_named_where_nothing_is_left_to_train(
    tmp_path: Path,
) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"text": "a single line " * 50}) + "\n")
    spec = SourceSpec(name="lonely", path=str(path), val_fraction=0.05)
    with pytest.raises(ValueError, match=rf"source 'lonely' \({path}\): holding out 0.05 of 1"):
        load_source_text(spec, tmp_path / "cache", seed=0)


def test_tokenized_cache_is_reused_and_documents_end_with_eos(tmp_path: Path) -> None:
    folder = ensure_synthetic_corpus("latin", 0, tmp_path, train_bytes=20_000, val_bytes=4_000)
    text = load_source_text(SourceSpec(name="l", path=str(folder)), tmp_path, seed=0)
    tok_path = train_tokenizer((r["text"] for r in text.train), 300, tmp_path / "tok")
    tok = load_tokenizer(tok_path)
    cache = tmp_path / "tokens"
    tokens = tokenize_source(text, tok, tokenizer_digest(tok_path), cache)
    assert (tokens.validation == tok.eos_token_id).sum() == len(text.validation)
    assert tokens.validation[-1] == tok.eos_token_id
    again = tokenize_source(text, tok, tokenizer_digest(tok_path), cache)
    assert np.array_equal(tokens.train, again.train) and len(list(cache.glob("tokens-*/"))) == 1
    assert isinstance(again.train, np.memmap) and again.train.dtype == np.uint16


def test_caches_follow_the_content_not_the_path(tmp_path: Path) -> None:
    """A moved (or copied) corpus finds its tokens again; an edited one does not."""
    folder = ensure_synthetic_corpus("greek", 0, tmp_path / "a", train_bytes=20_000)
    moved = tmp_path / "elsewhere" / "greek"
    shutil.copytree(folder, moved)
    keys = [
        load_source_text(SourceSpec(name="g", path=str(f)), tmp_path, 0).key
        for f in (folder, moved)
    ]
    assert keys[0] == keys[1]
    with (moved / "train.txt").open("a") as f:
        f.write("\n\nμία ακόμη")
    assert load_source_text(SourceSpec(name="g", path=str(moved)), tmp_path, 0).key != keys[0]
    capped = SourceSpec(name="g", path=str(folder), max_train_bytes=5_000)
    assert load_source_text(capped, tmp_path, 0).key != keys[0], "reading options count too"


def test_max_train_bytes_cuts_where_counting_each_document_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dept.data.shards, "ENCODE_BYTES", 500)  # many Arrow batches
    rows = [{"text": f"{'ü' * (i % 13)} line {i} " + "x" * (i % 31)} for i in range(600)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    whole = load_source_text(SourceSpec(name="d", path=str(path)), tmp_path / "c", 0)
    sizes = np.cumsum([len(t.encode("utf-8")) for t in whole.train["text"]])
    for cap in (1, int(sizes[0]), int(sizes[0]) + 1, 4_321, int(sizes[-1]), 10**9):
        spec = SourceSpec(name="d", path=str(path), max_train_bytes=cap)
        train = load_source_text(spec, tmp_path / "c", 0).train
        expected = max(1, int(np.searchsorted(sizes, cap)))
        assert train["text"] == whole.train["text"][:expected], cap


def test_the_tokenizer_sample_is_bounded_seeded_and_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dept.data.shards, "ENCODE_BYTES", 2_000)
    docs = [f"document {i} " * (1 + i % 5) for i in range(2_000)]
    table = datasets.Dataset.from_dict({"text": docs})
    assert list(text_sample(table, 10**9, seed=0)) == docs, "all of a source that fits"
    sample = list(text_sample(table, 20_000, seed=0))
    size = sum(len(d.encode()) for d in sample)
    assert 18_000 <= size < 20_000 + 100, "about the bound, never past its last document"
    positions = [docs.index(d) for d in sample]
    assert positions == sorted(positions) and positions[-1] > len(docs) // 2, "spread, in order"
    assert sample == list(text_sample(table, 20_000, seed=0))
    assert sample != list(text_sample(table, 20_000, seed=1))


def test_synthetic_languages_share_grammar_and_know_their_entropy(tmp_path: Path) -> None:
    grammar = make_grammar(0)
    assert np.allclose(grammar.probs.sum(axis=1), 1.0)
    folders = [ensure_synthetic_corpus(s, 0, tmp_path, 20_000, 5_000) for s in SCRIPTS]
    texts = [(f / "val.txt").read_text() for f in folders]
    assert len({t[:50] for t in texts}) == len(SCRIPTS), "each language has its own lexicon"
    for folder in folders:
        assert 0.1 < oracle_bpb(folder) < 2.0
    assert ensure_synthetic_corpus("latin", 0, tmp_path, 20_000, 5_000) == folders[0]


def test_text_spelling_the_eos_token_is_not_a_boundary(tmp_path: Path) -> None:
    docs = ["a <|endoftext|> b " * 30, "plain text " * 30]
    tok_path = train_tokenizer(docs, 300, tmp_path / "tok")
    tok = load_tokenizer(tok_path)
    table = datasets.Dataset.from_dict({"text": docs})
    text = SourceText(table, table, key="eos-text")
    tokens = tokenize_source(text, tok, tokenizer_digest(tok_path), tmp_path / "cache")
    assert (tokens.train == tok.eos_token_id).sum() == 2, "one EOS per document only"


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_path_loads_through_datasets(tmp_path: Path, streaming: bool) -> None:
    """The ``hf:`` form goes through ``datasets.load_dataset``; offline, a local dataset folder
    stands in for a Hub id (same call, same code path)."""
    folder = tmp_path / "hub-dataset"
    folder.mkdir()
    rows = [{"content": f"row {i} " * 10, "id": i} for i in range(100)]
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "train.parquet"))
    spec = SourceSpec(
        name="hub",
        path=f"hf:{folder}",
        text_column="content",
        streaming=streaming,
        max_train_bytes=3000,
        val_fraction=0.2,
    )
    text = load_source_text(spec, tmp_path / "cache", seed=0)
    assert text.train.column_names == ["text"]
    assert sum(len(t) for t in text.train["text"]) <= 3000 + 80
    assert len(text.validation) > 0
    if streaming:
        assert list((tmp_path / "cache" / "hub").glob("hub-*.parquet")), "the prefix is cached"


def _load_fails(spec: SourceSpec, cache: Path, message: str) -> ValueError:
    """Loading ``spec`` raises exactly ``message``, one line (the server shows the last line)."""
    with pytest.raises(ValueError) as caught:
        load_source_text(spec, cache, seed=0)
    assert str(caught.value) == message and "\n" not in message
    return caught.value


def _jsonl(path: Path, values: list) -> Path:
    path.write_text("".join(json.dumps({"content": v}) + "\n" for v in values))
    return path


def test_invalid_utf8_past_the_sniff_is_named_with_its_offset(tmp_path: Path) -> None:
    folder = tmp_path / "de"
    folder.mkdir()
    (folder / "train.txt").write_bytes(b"word " * 20_000 + b"\xff more\n")
    (folder / "val.txt").write_text("fine\n")
    spec = SourceSpec(name="de", path=str(folder))
    check_source_paths([spec])  # the first 64 KiB are fine
    error = _load_fails(
        spec,
        tmp_path / "cache",
        f"source 'de': {folder / 'train.txt'} is not UTF-8 text "
        "(invalid byte 0xff at offset 100000)",
    )
    assert isinstance(error.__cause__, DatasetGenerationError), "the traceback is kept"


def test_an_empty_file_is_named_by_the_load_too(tmp_path: Path) -> None:
    """Loading without the node's early check (a script, a benchmark) still names the file."""
    path = tmp_path / "docs.jsonl"
    path.write_text("")
    spec = SourceSpec(name="docs", path=str(path))
    _load_fails(spec, tmp_path / "cache", f"source 'docs': {path} is empty")


@pytest.mark.parametrize(
    ("bad", "row", "found"), [(17, 17, "int"), (["a", "b"], 3, "list"), ({"a": 1}, 5, "dict")]
)
def test_a_text_column_of_other_types_is_named(
    tmp_path: Path, bad: object, row: int, found: str
) -> None:
    values: list = [f"document {i}" for i in range(40)]
    values[row] = bad
    path = _jsonl(tmp_path / "code.jsonl", values)
    spec = SourceSpec(name="code", path=str(path), text_column="content")
    check_source_paths([spec])
    _load_fails(
        spec,
        tmp_path / "cache",
        f"source 'code': column 'content' of {path} holds {found} values (row {row}), not text",
    )


def test_a_type_change_deep_in_a_file_is_named(tmp_path: Path) -> None:
    values: list = ["ab"] * 100_010
    values[100_000] = 7
    path = _jsonl(tmp_path / "code.jsonl", values)
    spec = SourceSpec(name="code", path=str(path), text_column="content")
    _load_fails(
        spec,
        tmp_path / "cache",
        f"source 'code': column 'content' of {path} holds int values (row 100000), not text",
    )


def test_null_and_blank_rows_are_skipped_but_a_source_needs_some_text(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "docs.jsonl", [None, "", "  ", *[f"doc {i}" for i in range(20)]])
    spec = SourceSpec(name="docs", path=str(path), text_column="content", val_fraction=0.1)
    text = load_source_text(spec, tmp_path / "cache", seed=0)
    assert len(text.train) + len(text.validation) == 20
    _jsonl(path, [None, "", " \n "])
    _load_fails(
        spec, tmp_path / "cache", f"source 'docs': {path} has no text (no non-blank 'content')"
    )


def test_a_glob_names_its_pattern_and_files(tmp_path: Path) -> None:
    _jsonl(tmp_path / "a.jsonl", ["one", 2])
    _jsonl(tmp_path / "b.jsonl", ["three"])
    pattern = str(tmp_path / "*.jsonl")
    spec = SourceSpec(name="code", path=pattern, text_column="content")
    _load_fails(
        spec,
        tmp_path / "cache",
        f"source 'code': column 'content' of {pattern} (2 files, rows counted across them "
        "in name order) holds int values (row 1), not text",
    )


def test_a_parser_error_is_named_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "a"}\n{"text": \n')
    spec = SourceSpec(name="docs", path=str(path))
    error = _load_fails(
        spec,
        tmp_path / "cache",
        f"source 'docs': cannot read {path}: JSON parse error: Invalid value. in row 1",
    )
    assert isinstance(error.__cause__, DatasetGenerationError)


def test_pyarrow_errors_are_translated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other ``datasets`` versions report a type change as pyarrow's parse error."""
    path = _jsonl(tmp_path / "code.jsonl", ["fine"])

    def load_dataset(*args: object, **kwargs: object) -> None:
        try:
            raise pa.ArrowInvalid(
                "JSON parse error: Column(/content) changed from string\nto number"
            )
        except pa.ArrowInvalid as exc:
            raise DatasetGenerationError("An error occurred while generating the dataset") from exc

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    spec = SourceSpec(name="code", path=str(path), text_column="content")
    error = _load_fails(
        spec,
        tmp_path / "cache",
        f"source 'code': cannot read {path}: JSON parse error: Column(/content) changed from "
        "string to number",
    )
    assert isinstance(error.__cause__, DatasetGenerationError)
    assert isinstance(error.__cause__.__cause__, pa.ArrowInvalid)
