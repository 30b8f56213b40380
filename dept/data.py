"""Loading a source's text through ``datasets``, tokenizing it once, and packing it.

Documents are tokenized, joined with an EOS after each, and cut into fixed-length blocks
(``seq_len + 1`` tokens, so every block yields ``seq_len`` next-token targets). The token
arrays are cached next to the source's state, keyed by the tokenizer and the data, so no
round re-tokenizes. Training walks a seeded permutation of the blocks and remembers where
it stopped (:class:`StreamPosition`), so the next round continues instead of restarting.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from datasets.exceptions import DatasetGenerationError
from filelock import FileLock
from transformers import PreTrainedTokenizerFast

from dept.sources import BUILTIN_PREFIX, HF_PREFIX, SourceSpec, source_files
from dept.synthetic import ensure_synthetic_corpus
from dept.text_checks import file_problem, one_line

BUILDER_BY_SUFFIX = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
STDLIB_VAL_EVERY = 20


@dataclass
class SourceText:
    """A source's documents: ``datasets`` tables with one ``text`` column."""

    train: datasets.Dataset
    validation: datasets.Dataset
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
    return SourceText(train, text["validation"], folder=Path(spec.path))


def _load_file_table(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    """Local text/JSON Lines/Parquet/CSV files (a glob), validation held out of them."""
    suffix = Path(spec.path).suffix.lower()
    if suffix not in BUILDER_BY_SUFFIX:
        raise ValueError(
            f"source {spec.name!r}: cannot read {spec.path} "
            f"(supported: {', '.join(BUILDER_BY_SUFFIX)})"
        )
    table = _load_files(BUILDER_BY_SUFFIX[suffix], {"train": spec.path}, spec)["train"]
    return _hold_out(table, spec, seed)


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


def _hold_out(table: datasets.Dataset, spec: SourceSpec, seed: int) -> SourceText:
    parts = table.train_test_split(test_size=spec.val_fraction, seed=seed, shuffle=True)
    return SourceText(_capped(parts["train"], spec.max_train_bytes), parts["test"])


def _capped(table: datasets.Dataset, max_bytes: int) -> datasets.Dataset:
    """The first documents of ``table`` up to ``max_bytes`` of text (0 = no cap)."""
    if not max_bytes:
        return table
    sizes = np.cumsum([len(t.encode("utf-8")) for t in table["text"]])
    return table.select(range(max(1, int(np.searchsorted(sizes, max_bytes)))))


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
        return SourceText(_capped(table, spec.max_train_bytes), val_table)
    return _hold_out(table, spec, seed)


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
    return SourceText(
        _capped(table, spec.max_train_bytes), datasets.Dataset.from_dict({"text": val})
    )


@dataclass
class TokenizedSource:
    """A source's token stream per split (documents joined, EOS after each)."""

    train: np.ndarray  # (N_train,) int32 token ids
    validation: np.ndarray  # (N_val,) int32 token ids


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
    """Tokenize both splits once; later calls with the same tokenizer and data read the cache."""
    key = hashlib.sha256(
        json.dumps(
            [tokenizer_digest, text.train._fingerprint, text.validation._fingerprint]
        ).encode()
    ).hexdigest()[:20]
    path = cache_dir / f"tokens-{key}.npz"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not path.is_file():
            tmp = path.with_suffix(".tmp.npz")
            np.savez(
                tmp,
                train=_encode(text.train, tokenizer),
                validation=_encode(text.validation, tokenizer),
            )
            tmp.replace(path)
        with np.load(path, allow_pickle=False) as cached:
            return TokenizedSource(train=cached["train"], validation=cached["validation"])


def _encode(table: datasets.Dataset, tokenizer: PreTrainedTokenizerFast) -> np.ndarray:
    eos = tokenizer.eos_token_id
    backend = tokenizer.backend_tokenizer
    # Text that spells "<|endoftext|>" is text, not a document boundary.
    backend.encode_special_tokens = True
    pieces: list[np.ndarray] = []
    for start in range(0, len(table), 1000):
        batch = table[start : start + 1000]["text"]
        for enc in backend.encode_batch(batch, add_special_tokens=False):
            pieces.append(np.asarray([*enc.ids, eos], dtype=np.int32))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)


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
            yield np.stack([block(tokens, int(i), seq_len) for i in take])
        position.epoch, position.offset = position.epoch + 1, 0
