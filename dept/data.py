"""Loading a source's text through ``datasets``, tokenizing it once, and packing it.

Documents are tokenized, joined with an EOS after each, and cut into fixed-length blocks
(``seq_len + 1`` tokens, so every block yields ``seq_len`` next-token targets). The token
stream is written to disk shard by shard and read by memory map (:mod:`dept.shards`), in a
cache next to the source's state keyed by the tokenizer and the data's content (not its
path), so no round re-tokenizes and memory does not grow with the source. Text is read
from ``datasets``' memory-mapped Arrow tables in batches, never whole. Training walks a
seeded permutation of the blocks and remembers where it stopped (:class:`StreamPosition`),
so the next round continues instead of restarting.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.exceptions import DatasetGenerationError
from filelock import FileLock
from transformers import PreTrainedTokenizerFast

from dept.fingerprint import digest, files_key
from dept.shards import Plan, tokenized_splits
from dept.sources import BUILTIN_PREFIX, HF_PREFIX, SourceSpec, source_files
from dept.synthetic import ensure_synthetic_corpus
from dept.text_checks import file_problem, one_line

BUILDER_BY_SUFFIX = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
STDLIB_VAL_EVERY = 20
TOKENS_FORMAT = 2  # 1: one .npz of int32 per source; 2: memory-mapped shards (dept.shards)
SAMPLE_STREAM = 0x70C  # the tokenizer sample's random stream, apart from the run's others


@dataclass
class SourceText:
    """A source's documents: ``datasets`` tables with one ``text`` column."""

    train: datasets.Dataset
    validation: datasets.Dataset
    key: str  # what the documents are (content and reading options), for cache keys
    folder: Path | None = None  # set where the text lives in a local folder


def load_source_text(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    """Read a source's train and validation documents, whatever form the source takes."""
    return LOADERS[spec.kind](spec, cache_dir, seed)


def _load_dir(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    """A folder with ``train.txt`` and ``val.txt``."""
    files = {
        "train": str(Path(spec.path) / "train.txt"),
        "validation": str(Path(spec.path) / "val.txt"),
    }
    text = _load_files("text", files, spec)
    train = _capped(text["train"], spec.max_train_bytes)
    key = _reading_key(spec, files_key(source_files(spec)))
    return SourceText(train, text["validation"], key, folder=Path(spec.path))


def _load_file_table(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    """Local text/JSON Lines/Parquet/CSV files (a glob), validation held out of them."""
    suffix = Path(spec.path).suffix.lower()
    if suffix not in BUILDER_BY_SUFFIX:
        raise ValueError(
            f"source {spec.name!r}: cannot read {spec.path} "
            f"(supported: {', '.join(BUILDER_BY_SUFFIX)})"
        )
    table = _load_files(BUILDER_BY_SUFFIX[suffix], {"train": spec.path}, spec)["train"]
    return _hold_out(table, spec, seed, files_key(source_files(spec)))


def _load_files(builder: str, files: dict[str, str], spec: SourceSpec) -> datasets.DatasetDict:
    kwargs = {"sample_by": spec.sample_by} if builder == "text" else {}
    try:  # (StopIteration is what datasets' json builder raises for an empty file)
        loaded = datasets.load_dataset(builder, data_files=files, **kwargs)
    except (DatasetGenerationError, ValueError, pa.ArrowException, StopIteration) as exc:
        raise _load_error(spec, exc) from exc
    return datasets.DatasetDict(
        {k: _text_only(v, spec, _files_named(spec, files[k])) for k, v in loaded.items()}
    )


def _files_named(spec: SourceSpec, pattern: str) -> str:
    """``pattern`` as a message names it: the file, or the glob and how many files it matches."""
    matches = source_files(spec) if spec.kind == "files" else [Path(pattern)]
    if len(matches) == 1:
        return str(matches[0])
    return f"{pattern} ({len(matches)} files, rows counted across them in name order)"


def _load_error(spec: SourceSpec, exc: BaseException) -> ValueError:
    """``datasets`` failing to read a local source, as one line naming source, file and problem.

    The bad file is found by checking each file again (its whole text for a UTF-8 error,
    which ``datasets`` reports without the file); failing that, the underlying error is named.
    """
    causes = list(_chain(exc))
    whole = any(isinstance(e, UnicodeDecodeError) for e in causes)
    paths = source_files(spec)
    for path in paths:
        problem = file_problem(path, whole=whole)
        if problem:
            return ValueError(f"source {spec.name!r}: {path} {problem}")
    cause = next((e for e in causes if not isinstance(e, DatasetGenerationError)), exc)
    reason = one_line(str(cause)) or type(cause).__name__
    where = paths[0] if len(paths) == 1 else spec.path  # the file, else the folder or glob
    return ValueError(f"source {spec.name!r}: cannot read {where}: {reason}")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes (``raise ... from``, or raised while handling), outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _text_only(table: datasets.Dataset, spec: SourceSpec, origin: str) -> datasets.Dataset:
    """The ``text`` column of ``table`` (read from ``origin``), blank and null rows dropped."""
    column = spec.text_column
    if column not in table.column_names:
        raise ValueError(
            f"source {spec.name!r}: no column {column!r} in {origin} "
            f"(columns: {', '.join(table.column_names)}); set 'text-column'"
        )
    table = table.select_columns([column])
    if column != "text":
        table = table.rename_column(column, "text")
    table = table.filter(_has_text(spec, origin), with_indices=True)
    if not len(table):
        raise ValueError(f"source {spec.name!r}: {origin} has no text (no non-blank {column!r})")
    return table


def _has_text(spec: SourceSpec, origin: str) -> Callable[[dict, int], bool]:
    """A row filter keeping non-blank text; a value that is neither text nor null is an error."""

    def has_text(row: dict, index: int) -> bool:
        text = row["text"]
        if text is not None and not isinstance(text, str):
            raise ValueError(
                f"source {spec.name!r}: column {spec.text_column!r} of {origin} holds "
                f"{type(text).__name__} values (row {index}), not text"
            )
        return bool(text and text.strip())

    return has_text


def _hold_out(table: datasets.Dataset, spec: SourceSpec, seed: int, content: str) -> SourceText:
    parts = table.train_test_split(test_size=spec.val_fraction, seed=seed, shuffle=True)
    train = _capped(parts["train"], spec.max_train_bytes)
    return SourceText(train, parts["test"], _reading_key(spec, content, seed))


def _reading_key(spec: SourceSpec, content: str, seed: int | None = None) -> str:
    """The key of the documents read from data ``content`` with ``spec``'s reading options
    (and ``seed``, where it picks the validation documents); the source's path is left out."""
    options = (spec.text_column, spec.config, spec.split, spec.val_split, spec.val_fraction)
    return digest(content, options, spec.streaming, spec.max_train_bytes, spec.sample_by, seed)


def _capped(table: datasets.Dataset, max_bytes: int) -> datasets.Dataset:
    """The first documents of ``table`` before the one reaching ``max_bytes`` of text in
    all (at least one; 0 = no cap), their sizes counted by Arrow batch by batch."""
    if not max_bytes:
        return table
    total = 0
    for start, sizes in _byte_sizes(table):
        cumulative = total + np.cumsum(sizes)
        if cumulative[-1] >= max_bytes:
            cut = start + int(np.searchsorted(cumulative, max_bytes))
            return table.select(range(max(1, cut)))
        total = int(cumulative[-1])
    return table


def _byte_sizes(table: datasets.Dataset) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, UTF-8 bytes of each document) per batch of ``table``'s rows."""
    arrow, rows = table.with_format("arrow"), Plan.for_table(table).rows_per_batch
    for start in range(0, len(table), rows):
        lengths = pc.binary_length(arrow[start : start + rows]["text"])
        yield start, lengths.to_numpy().astype(np.int64)


def text_sample(table: datasets.Dataset, max_bytes: int, seed: int) -> Iterator[str]:
    """About ``max_bytes`` of ``table``'s documents, in their order, to train a tokenizer on.

    All of them when they fit; else each is kept with probability ``max_bytes`` / total
    (seeded), until the ones kept reach ``max_bytes`` (so never more than that and one
    document). A seeded sample, not the first documents: a corpus sorted by topic or date
    would give a lopsided vocabulary.
    """
    total = sum(int(sizes.sum()) for _, sizes in _byte_sizes(table))
    keep = min(1.0, max_bytes / max(total, 1))
    rng = np.random.default_rng([seed, SAMPLE_STREAM])
    arrow, taken = table.with_format("arrow"), 0
    for start, sizes in _byte_sizes(table):
        chosen = rng.random(len(sizes)) < keep
        texts = arrow[start : start + len(sizes)]["text"].filter(pa.array(chosen))
        for text, size in zip(texts.to_pylist(), sizes[chosen], strict=True):
            yield text
            taken += int(size)
            if taken >= max_bytes:
                return


def _load_hub(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    dataset_id = spec.path[len(HF_PREFIX) :]
    load = {"path": dataset_id, "name": spec.config or None, "streaming": spec.streaming}
    if spec.streaming:
        table = _streamed_prefix(spec, load, cache_dir)
    else:
        table = datasets.load_dataset(split=spec.split, **load)
        table = _text_only(table, spec, _hub_split(spec, spec.split))
    if spec.val_split:
        val = datasets.load_dataset(split=spec.val_split, **load)
        val_rows = val if not spec.streaming else _take_bytes(val, spec, 2_000_000)
        val_table = datasets.Dataset.from_list(list(val_rows))
        val_table = _text_only(val_table, spec, _hub_split(spec, spec.val_split))
        key = _reading_key(spec, digest(dataset_id, len(table), len(val_table)))
        return SourceText(_capped(table, spec.max_train_bytes), val_table, key)
    return _hold_out(table, spec, seed, digest(dataset_id, len(table)))


def _hub_split(spec: SourceSpec, split: str) -> str:
    return f"{spec.path} (split {split!r})"


def _streamed_prefix(spec: SourceSpec, load: dict, cache_dir: Path) -> datasets.Dataset:
    """The first ``max-train-bytes`` of a streamed dataset, fetched once and kept on disk."""
    key = hashlib.sha256(
        json.dumps(
            [load, spec.split, spec.text_column, spec.max_train_bytes], sort_keys=True
        ).encode()
    ).hexdigest()[:16]
    path = cache_dir / "hub" / f"{spec.name}-{key}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not path.is_file():
            stream = datasets.load_dataset(split=spec.split, **load)
            rows = _take_bytes(stream, spec, spec.max_train_bytes or 100_000_000)
            table = datasets.Dataset.from_list(rows)
            _text_only(table, spec, _hub_split(spec, spec.split)).to_parquet(str(path))
    return datasets.Dataset.from_parquet(str(path))


def _take_bytes(stream: datasets.IterableDataset, spec: SourceSpec, max_bytes: int) -> list[dict]:
    rows, size = [], 0
    for row in stream:
        text = row.get(spec.text_column)
        if isinstance(text, str) and text.strip():
            rows.append({spec.text_column: text})
            size += len(text.encode("utf-8"))
            if size >= max_bytes:
                break
    return rows


def _load_builtin(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    name = spec.path[len(BUILTIN_PREFIX) :]
    if name == "python-stdlib":
        return _python_stdlib(spec)
    if name.startswith("synthetic-"):
        folder = ensure_synthetic_corpus(name[len("synthetic-") :], seed, cache_dir / "synthetic")
        dir_spec = SourceSpec(**{**asdict(spec), "path": str(folder)})
        return load_source_text(dir_spec, cache_dir, seed)
    raise ValueError(
        f"source {spec.name!r}: unknown built-in source {spec.path!r} "
        "(known: builtin:python-stdlib, builtin:synthetic-<latin|cyrillic|greek|georgian>)"
    )


def _python_stdlib(spec: SourceSpec) -> SourceText:
    """The running interpreter's own standard library sources, one document per module."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:
        raise FileNotFoundError(f"source {spec.name!r}: no .py files under {root}")
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    val = [t for i, t in enumerate(texts) if i % STDLIB_VAL_EVERY == 0]
    train = [t for i, t in enumerate(texts) if i % STDLIB_VAL_EVERY != 0]
    table = datasets.Dataset.from_dict({"text": train})
    key = _reading_key(spec, digest(sys.version, files_key(files)))
    return SourceText(
        _capped(table, spec.max_train_bytes), datasets.Dataset.from_dict({"text": val}), key
    )


@dataclass
class TokenizedSource:
    """A source's token stream per split (documents joined, EOS after each)."""

    train: np.ndarray  # (N_train,) token ids, uint16 or uint32, memory-mapped
    validation: np.ndarray  # (N_val,) token ids, likewise


# How each kind of source (:attr:`dept.sources.SourceSpec.kind`) is read.
LOADERS: dict[str, Callable[[SourceSpec, Path, int], SourceText]] = {
    "hf": _load_hub,
    "builtin": _load_builtin,
    "dir": _load_dir,
    "files": _load_file_table,
}


def tokenize_source(
    text: SourceText, tokenizer: PreTrainedTokenizerFast, tokenizer_digest: str, cache_dir: Path
) -> TokenizedSource:
    """Tokenize both splits once, resuming an interrupted preparation; later calls with the
    same tokenizer and data map the cache."""
    folder = cache_dir / f"tokens-{digest(tokenizer_digest, text.key, TOKENS_FORMAT)}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        splits = tokenized_splits(
            {"train": text.train, "validation": text.validation},
            tokenizer.backend_tokenizer,
            tokenizer.eos_token_id,
            folder,
        )
    return TokenizedSource(train=splits["train"], validation=splits["validation"])


def num_blocks(tokens: np.ndarray, seq_len: int) -> int:
    """How many ``seq_len + 1`` blocks (stride ``seq_len``) the stream holds."""
    return max(0, (len(tokens) - 1) // seq_len)


def block(tokens: np.ndarray, index: int, seq_len: int) -> np.ndarray:
    start = index * seq_len
    return tokens[start : start + seq_len + 1]


@dataclass
class StreamPosition:
    """Where a source's training stream stands: epoch of the permutation and offset in it."""

    epoch: int = 0
    offset: int = 0


def training_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, position: StreamPosition
) -> Iterator[np.ndarray]:
    """Endless (B, seq_len + 1) batches in a seeded order per epoch, advancing ``position``."""
    n = num_blocks(tokens, seq_len)
    if n < batch_size:
        raise ValueError(
            f"the training text has {len(tokens)} tokens: fewer than one batch "
            f"of {batch_size} x {seq_len + 1}"
        )
    while True:
        order = np.random.default_rng([seed, position.epoch]).permutation(n)
        while position.offset < n:
            take = order[position.offset : position.offset + batch_size]
            if len(take) < batch_size:  # the last partial batch of an epoch is skipped
                break
            position.offset += batch_size
            yield np.stack([block(tokens, int(i), seq_len) for i in take]).astype(np.int32)
        position.epoch, position.offset = position.epoch + 1, 0
