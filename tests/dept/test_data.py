import json
from pathlib import Path

import numpy as np
import pytest

from dept.data import (
    SourceText,
    StreamPosition,
    block,
    load_source_text,
    num_blocks,
    tokenize_source,
    training_batches,
)
from dept.sources import SourceSpec
from dept.synthetic import SCRIPTS, ensure_synthetic_corpus, make_grammar, oracle_bpb
from dept.vocab import load_tokenizer, tokenizer_digest, train_tokenizer
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
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    spec = SourceSpec(name="docs", path=str(path), text_column="body", val_fraction=0.1)
    text = load_source_text(spec, tmp_path / "cache", seed=0)
    assert (len(text.train), len(text.validation)) == (180, 20)
    bad = SourceSpec(name="docs", path=str(path), text_column="missing")
    with pytest.raises(ValueError, match="text-column"):
        load_source_text(bad, tmp_path / "cache", seed=0)


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
    assert np.array_equal(tokens.train, again.train) and len(list(cache.glob("*.npz"))) == 1


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
    import datasets

    table = datasets.Dataset.from_dict({"text": docs})
    text = SourceText(table, table)
    tokens = tokenize_source(text, tok, tokenizer_digest(tok_path), tmp_path / "cache")
    assert (tokens.train == tok.eos_token_id).sum() == 2, "one EOS per document only"


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_path_loads_through_datasets(tmp_path: Path, streaming: bool) -> None:
    """The ``hf:`` form goes through ``datasets.load_dataset``; offline, a local dataset folder
    stands in for a Hub id (same call, same code path)."""
    import datasets

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
