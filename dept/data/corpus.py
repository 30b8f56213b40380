"""Reading a source's documents, whatever form the source takes (built in, a folder, local
files, a ``datasets`` save_to_disk folder, MDS shards, a Hugging Face dataset), into a train
and a validation split.

``datasets`` reads and parses the files; each split (blank rows dropped, documents held out,
the ``max-train-bytes`` cut) is then written once to an Arrow file of its own, keyed by what
the documents are (content and reading options, not their path), and every pass over the
text reads it by plain reads (:mod:`dept.data.arrow_text`), never by a memory map that would
keep its pages resident. Tokenizing and batching them is :mod:`dept.data.token_stream`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.exceptions import DatasetGenerationError
from filelock import FileLock

from dept.data import arrow_text, mds
from dept.data.arrow_text import Rows
from dept.data.fingerprint import digest, files_key
from dept.data.pieces import MAX_DOCUMENT_BYTES, longest_document, training_pieces
from dept.data.shards import Plan
from dept.data.sources import (
    BUILDER_BY_SUFFIX,
    BUILTIN_PREFIX,
    HF_PREFIX,
    SourceSpec,
    check_mds_text,
    folder_kind,
    mds_splits,
    source_files,
)
from dept.data.synthetic import ensure_synthetic_corpus
from dept.data.text_checks import file_problem, one_line

STDLIB_VAL_EVERY = 20
SAMPLE_STREAM = 0x70C  # the tokenizer sample's random stream, apart from the run's others
SPLITS = ("train", "validation")
# Rows per record batch in datasets' Arrow files (its default 1,000; its builders' ~10 MB
# chunks cap it): mapping a table reads each batch's header with ~64 KB of fault-around, so
# 1,000-row batches of a 2 GB source would leave ~450 MB resident before any pass.
WRITER_ROWS = 100_000


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
    key = _reading_key(spec, files_key(source_files(spec)))

    def choose() -> dict[str, Rows]:
        text = _load_files("text", files, spec)
        return {**text, "train": text["train"].capped(spec.max_train_bytes)}

    return _written(spec, cache_dir, key, choose, folder=Path(spec.path))


def _load_file_table(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    """Local data files (one file, a glob, or a folder's files of one format), validation
    held out of them."""
    files = source_files(spec)
    suffix = files[0].suffix.lower()
    if suffix not in BUILDER_BY_SUFFIX:
        raise ValueError(
            f"source {spec.name!r}: cannot read {spec.path} "
            f"(supported: {', '.join(BUILDER_BY_SUFFIX)})"
        )
    key = _reading_key(spec, files_key(files), seed)
    pattern = spec.path if spec.kind == "files" else [str(p) for p in files]

    def choose() -> dict[str, Rows]:
        rows = _load_files(BUILDER_BY_SUFFIX[suffix], {"train": pattern}, spec)["train"]
        return _hold_out(rows, spec, seed)

    return _written(spec, cache_dir, key, choose)


def _load_saved(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    """A folder ``datasets`` wrote with ``save_to_disk``: one Dataset, validation held out of
    it, or a DatasetDict, of which ``split`` is read (and ``val-split``, where given)."""
    key = _reading_key(spec, files_key(source_files(spec)), seed)

    def choose() -> dict[str, Rows]:
        try:
            saved = datasets.load_from_disk(spec.path)
        except (OSError, ValueError, pa.ArrowException) as exc:
            reason = one_line(str(exc)) or type(exc).__name__
            raise ValueError(f"source {spec.name!r}: cannot read {spec.path}: {reason}") from exc
        if isinstance(saved, datasets.Dataset):
            if spec.val_split:
                raise ValueError(
                    f"source {spec.name!r}: {spec.path} holds one Dataset, no splits, so "
                    f"'val-split' ({spec.val_split!r}) names nothing; leave it out to hold "
                    "'val-fraction' of its documents out"
                )
            return _hold_out(_text_only(saved, spec, spec.path), spec, seed)
        train = _text_only(_saved_split(saved, spec, spec.split), spec, _split_of(spec, spec.split))
        if not spec.val_split:
            return _hold_out(train, spec, seed)
        validation = _saved_split(saved, spec, spec.val_split)
        return {
            "train": train.capped(spec.max_train_bytes),
            "validation": _text_only(validation, spec, _split_of(spec, spec.val_split)),
        }

    return _written(spec, cache_dir, key, choose)


def _load_mds(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    """MDS shards (:mod:`dept.data.mds`): one MDS folder, validation held out of it, or a
    folder of splits, of which ``split`` is read (and ``val-split``, where given)."""
    train_folder, val_folder = mds_splits(spec)
    check_mds_text(spec)
    key = _reading_key(spec, files_key(source_files(spec)), seed)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix="mds-") as scratch:

        def read(folder: Path) -> Rows:
            table = datasets.Dataset.from_generator(
                mds.texts,
                gen_kwargs={"folder": str(folder), "column": spec.text_column},
                features=datasets.Features({arrow_text.TEXT: datasets.Value("string")}),
                cache_dir=scratch,
                writer_batch_size=WRITER_ROWS,
            )
            return _text_only(table, spec, str(folder), column=arrow_text.TEXT)

        def choose() -> dict[str, Rows]:
            train = read(train_folder)
            if val_folder is None:
                return _hold_out(train, spec, seed)
            return {"train": train.capped(spec.max_train_bytes), "validation": read(val_folder)}

        return _written(spec, cache_dir, key, choose)


def _saved_split(saved: datasets.DatasetDict, spec: SourceSpec, split: str) -> datasets.Dataset:
    if split not in saved:
        key = "split" if split == spec.split else "val-split"
        raise ValueError(
            f"source {spec.name!r}: {spec.path} has no split {split!r} (its splits: "
            f"{', '.join(saved)}); set {key!r}"
        )
    return saved[split]


def _written(
    spec: SourceSpec,
    cache_dir: Path,
    key: str,
    choose: Callable[[], dict[str, Rows]],
    folder: Path | None = None,
) -> SourceText:
    """The splits ``choose`` picks, written once to files of their own (:mod:`dept.data.arrow_text`)
    keyed by what they are, and read from there by every later load."""
    out = cache_dir / "text" / f"{spec.name}-{key}"
    paths = {split: out / f"{split}.arrow" for split in SPLITS}
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not all(p.is_file() for p in paths.values()):
            chosen = choose()
            out.mkdir(parents=True, exist_ok=True)
            for split, path in paths.items():
                arrow_text.write(chosen[split], path)
    train, validation = (datasets.Dataset.from_file(str(paths[s])) for s in SPLITS)
    return SourceText(train, validation, key, folder)


def _load_files(
    builder: str, files: Mapping[str, str | list[str]], spec: SourceSpec
) -> dict[str, Rows]:
    check_document_sizes(builder, files, spec)
    kwargs = {"sample_by": spec.sample_by} if builder == "text" else {}
    try:  # (StopIteration is what datasets' json builder raises for an empty file)
        loaded = datasets.load_dataset(
            builder, data_files=files, writer_batch_size=WRITER_ROWS, **kwargs
        )
    except (DatasetGenerationError, ValueError, pa.ArrowException, StopIteration) as exc:
        raise _load_error(spec, exc) from exc
    return {k: _text_only(v, spec, _files_named(spec, files[k])) for k, v in loaded.items()}


# what ends a document, by builder and (text) sample-by: datasets reads a document whole
DOCUMENT_ENDS = {"json": b"\n", "line": b"\n", "paragraph": b"\n\n", "document": None}


def check_document_sizes(
    builder: str, files: Mapping[str, str | list[str]], spec: SourceSpec
) -> None:
    """A :class:`ValueError` naming the file, the document and the fix where one document of
    a text or JSON Lines file is over :data:`MAX_DOCUMENT_BYTES`, found in seconds by a scan
    of the bytes, before ``datasets`` would load it whole (and memory would follow it)."""
    if builder not in ("text", "json"):
        return
    separator = DOCUMENT_ENDS["json" if builder == "json" else spec.sample_by]
    for path in (p for pattern in files.values() for p in _matching(spec, pattern)):
        size, number = longest_document(path, separator)
        if size > MAX_DOCUMENT_BYTES:
            what = "line" if separator == b"\n" else "paragraph" if separator else "file"
            raise ValueError(
                f"source {spec.name!r}: {path} holds a document of {size / 2**20:.0f} MiB "
                f"({what} {number}), more than the {MAX_DOCUMENT_BYTES >> 20} MiB one may be: "
                "split it into documents (one per line with sample-by 'line', or paragraphs "
                "separated by a blank line)"
            )


def _matching(spec: SourceSpec, pattern: str | list[str]) -> list[Path]:
    """The local files ``pattern`` names (a ``dir`` source's file; for the others, all the
    source's files)."""
    if isinstance(pattern, str) and spec.kind == "dir":
        return [Path(pattern)]
    return source_files(spec)


def _files_named(spec: SourceSpec, pattern: str | list[str]) -> str:
    """``pattern`` as a message names it: the file, or the glob or folder and how many files
    it matches."""
    matches = _matching(spec, pattern)
    if len(matches) == 1:
        return str(matches[0])
    return f"{spec.path} ({len(matches)} files, rows counted across them in name order)"


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


def _text_only(
    table: datasets.Dataset, spec: SourceSpec, origin: str, column: str | None = None
) -> Rows:
    """The rows of ``table`` (read from ``origin``) with text in ``column`` (default: the
    source's ``text-column``), blank and null rows dropped."""
    column = column or spec.text_column
    if column not in table.column_names:
        raise ValueError(
            f"source {spec.name!r}: no column {column!r} in {origin} "
            f"(columns: {', '.join(table.column_names)}); set 'text-column'"
        )
    try:
        rows = arrow_text.scan(table, column)
    except arrow_text.NotTextError as exc:
        raise ValueError(
            f"source {spec.name!r}: column {spec.text_column!r} of {origin} holds "
            f"{exc.found} values (row {exc.row}), not text"
        ) from None
    if not len(rows.ids):
        raise _no_text(spec, origin)
    return rows


def _no_text(spec: SourceSpec, origin: str) -> ValueError:
    column = spec.text_column
    return ValueError(f"source {spec.name!r}: {origin} has no text (no non-blank {column!r})")


def _hold_out(rows: Rows, spec: SourceSpec, seed: int) -> dict[str, Rows]:
    try:
        train, validation = arrow_text.held_out(len(rows.ids), spec.val_fraction, seed)
    except ValueError as exc:  # which source, and where its documents come from
        raise ValueError(f"source {spec.name!r} ({spec.path}): {exc}") from exc
    return {
        "train": rows.take(train).capped(spec.max_train_bytes),
        "validation": rows.take(validation),
    }


def _reading_key(spec: SourceSpec, content: str, seed: int | None = None) -> str:
    """The key of the documents read from data ``content`` with ``spec``'s reading options
    (and ``seed``, where it picks the validation documents); the source's path is left out."""
    options = (spec.text_column, spec.config, spec.split, spec.val_split, spec.val_fraction)
    return digest(content, options, spec.streaming, spec.max_train_bytes, spec.sample_by, seed)


def text_sample(table: datasets.Dataset, max_bytes: int, seed: int) -> Iterator[str]:
    """About ``max_bytes`` of ``table``'s documents, in their order, to train a tokenizer on.

    All of them when they fit; else each is kept with probability ``max_bytes`` / total
    (seeded), until the ones kept reach ``max_bytes`` (so never more than that and one
    document). A seeded sample, not the first documents: a corpus sorted by topic or date
    would give a lopsided vocabulary. Two passes over the text, by plain reads.
    """
    rows = Plan.for_table(table).rows_per_batch
    sizes = (pc.binary_length(texts) for texts in arrow_text.batches(table, 0, rows))
    total = sum(pc.sum(size).as_py() or 0 for size in sizes)
    keep = min(1.0, max_bytes / max(total, 1))
    rng = np.random.default_rng([seed, SAMPLE_STREAM])
    taken = 0
    for texts in arrow_text.batches(table, 0, rows):
        chosen = texts.filter(pa.array(rng.random(len(texts)) < keep))
        for text, size in zip(chosen.to_pylist(), pc.binary_length(chosen).to_numpy(), strict=True):
            yield from training_pieces(text)  # a long document or word in bounded pieces
            taken += int(size)
            if taken >= max_bytes:
                return


def _load_hub(spec: SourceSpec, cache_dir: Path, seed: int) -> SourceText:
    dataset_id = spec.path[len(HF_PREFIX) :]
    if Path(dataset_id).is_dir() and folder_kind(Path(dataset_id)) == "saved":
        raise ValueError(  # datasets' own message says to call load_from_disk
            f"source {spec.name!r}: {dataset_id} is a folder save_to_disk wrote: give it as "
            f"a local path, without {HF_PREFIX!r} (path: {dataset_id})"
        )
    load = {"path": dataset_id, "name": spec.config or None, "streaming": spec.streaming}
    origin = _split_of(spec, spec.split)
    if spec.streaming:
        prefix = _streamed_prefix(spec, load, cache_dir)
        rows = _text_only(prefix, spec, origin, column=arrow_text.TEXT)
    else:
        table = datasets.load_dataset(split=spec.split, writer_batch_size=WRITER_ROWS, **load)
        rows = _text_only(table, spec, origin)
    if not spec.val_split:
        key = _reading_key(spec, digest(dataset_id, len(rows.ids)), seed)
        return _written(spec, cache_dir, key, lambda: _hold_out(rows, spec, seed))
    val = datasets.load_dataset(split=spec.val_split, **load)
    val_rows = val if not spec.streaming else _take_bytes(val, spec, 2_000_000)
    val_table = datasets.Dataset.from_list(list(val_rows))
    validation = _text_only(val_table, spec, _split_of(spec, spec.val_split))
    key = _reading_key(spec, digest(dataset_id, len(rows.ids), len(validation.ids)))
    train = rows.capped(spec.max_train_bytes)
    return _written(spec, cache_dir, key, lambda: {"train": train, "validation": validation})


def _split_of(spec: SourceSpec, split: str) -> str:
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
            if not rows:
                raise _no_text(spec, _split_of(spec, spec.split))
            texts = [row[spec.text_column] for row in rows]
            datasets.Dataset.from_dict({arrow_text.TEXT: texts}).to_parquet(str(path))
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
        return _python_stdlib(spec, cache_dir)
    if name.startswith("synthetic-"):
        folder = ensure_synthetic_corpus(name[len("synthetic-") :], seed, cache_dir / "synthetic")
        dir_spec = SourceSpec(**{**asdict(spec), "path": str(folder)})
        return load_source_text(dir_spec, cache_dir, seed)
    raise ValueError(
        f"source {spec.name!r}: unknown built-in source {spec.path!r} "
        "(known: builtin:python-stdlib, builtin:synthetic-<latin|cyrillic|greek|georgian>)"
    )


def _python_stdlib(spec: SourceSpec, cache_dir: Path) -> SourceText:
    """The running interpreter's own standard library sources, one document per module."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if not files:
        raise FileNotFoundError(f"source {spec.name!r}: no .py files under {root}")
    key = _reading_key(spec, digest(sys.version, files_key(files)))

    def choose() -> dict[str, Rows]:
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
        val = [t for i, t in enumerate(texts) if i % STDLIB_VAL_EVERY == 0]
        train = [t for i, t in enumerate(texts) if i % STDLIB_VAL_EVERY != 0]
        tables = (datasets.Dataset.from_dict({arrow_text.TEXT: t}) for t in (train, val))
        rows = [arrow_text.scan(t, arrow_text.TEXT, keep_blank=True) for t in tables]
        return {"train": rows[0].capped(spec.max_train_bytes), "validation": rows[1]}

    return _written(spec, cache_dir, key, choose)


# How each kind of source (:attr:`dept.data.sources.SourceSpec.kind`) is read.
LOADERS: dict[str, Callable[[SourceSpec, Path, int], SourceText]] = {
    "hf": _load_hub,
    "builtin": _load_builtin,
    "dir": _load_dir,
    "saved": _load_saved,
    "mds": _load_mds,
    "folder": _load_file_table,
    "files": _load_file_table,
}
