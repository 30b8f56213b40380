"""Data sources: what a source is, the sources file that lists them, and the built-in default.

A sources file is YAML, either a list of entries or a mapping with a ``sources:`` list::

    sources:
      - name: de-novels
        path: ../shared/corpora/de-novels   # a folder with train.txt and val.txt
        vocab-size: 4096
      - name: papers
        path: /data/papers                  # a folder of .txt (or .jsonl, .parquet...) files
      - name: wiki-fr
        path: hf:wikimedia/wikipedia         # a Hugging Face dataset
        config: 20231101.fr
        streaming: true
        max-train-bytes: 50000000           # the first 50 MB of its training text
        tokenizer-sample-bytes: 16000000    # a seeded 16 MB sample trains its tokenizer

Relative ``path`` values resolve against the folder of the sources file. A local folder is
read by what it holds (:func:`folder_kind`): ``train.txt`` and ``val.txt``; a ``datasets``
``save_to_disk`` folder; MosaicML MDS shards (:mod:`dept.data.mds`); or data files of one
format, found in it and below it.

``tokenizer-sample-bytes`` bounds the text a tokenizer is trained on: a seeded sample of
the source's training documents (all of them where they fit), for its own tokenizer
(SPEC-OPT); for the run's global one each source gives at most this and an equal share of
:data:`GLOBAL_SAMPLE_BYTES`. Tokenizing the whole source streams it through shards on disk
(:mod:`dept.data.corpus`), so neither needs memory that grows with the source.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from dept.config import (
    MAX_VOCAB_SIZE,
    MIN_VOCAB_SIZE,
    ConfigError,
    DeptConfig,
    YamlLoader,
    build_structured,
    kebab,
)
from dept.data import mds
from dept.data.text_checks import decode_error_text, file_problem, one_line
from dept.paths import resolve_path

HF_PREFIX = "hf:"
BUILTIN_PREFIX = "builtin:"
# Kinds named by a path prefix; any other path is on this machine: a folder (its kind is
# what it holds, :func:`folder_kind`) or a file or glob ("files").
PREFIXED_KINDS = {HF_PREFIX: "hf", BUILTIN_PREFIX: "builtin"}
# On this machine: resolved against the sources file, checked before any training.
LOCAL_KINDS = ("dir", "saved", "mds", "folder", "files")
# The data files a "files" or "folder" source may hold, and the ``datasets`` builder of each.
BUILDER_BY_SUFFIX = {
    ".txt": "text",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
SPLIT_FILES = ("train.txt", "val.txt")  # a "dir" source
# What ``datasets``' save_to_disk writes: a DatasetDict's index, or one Dataset's two files.
SAVED_DICT = "dataset_dict.json"
SAVED_DATASET = ("state.json", "dataset_info.json")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SAMPLE_BY = ("line", "paragraph", "document")
GLOBAL_SAMPLE_BYTES = 8_000_000  # the global tokenizer's sample, shared equally by sources


@dataclass
class SourceSpec:
    """One data source: where its text is and how to tokenize it."""

    name: str = ""
    path: str = ""
    vocab_size: int = 2048
    text_column: str = "text"
    config: str = ""
    split: str = "train"
    val_split: str = ""
    val_fraction: float = 0.05
    streaming: bool = False
    max_train_bytes: int = 0
    sample_by: str = "paragraph"
    nproc: int = 1  # processes (GPUs) its training is split over (:mod:`dept.train.distributed`)
    tokenizer_sample_bytes: int = 32_000_000

    def __post_init__(self) -> None:
        where = f"source {self.name!r}"
        if not NAME_PATTERN.match(self.name):
            raise ConfigError(f"{where}: 'name' must match {NAME_PATTERN.pattern}")
        if not self.path:
            raise ConfigError(f"{where}: 'path' is required")
        if not MIN_VOCAB_SIZE <= self.vocab_size <= MAX_VOCAB_SIZE:
            raise ConfigError(
                f"{where}: 'vocab-size' must be in [{MIN_VOCAB_SIZE}, {MAX_VOCAB_SIZE:,}]"
            )
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"{where}: 'val-fraction' must be in (0, 1)")
        if self.sample_by not in SAMPLE_BY:
            raise ConfigError(f"{where}: 'sample-by' must be one of {', '.join(SAMPLE_BY)}")
        if self.max_train_bytes < 0:
            raise ConfigError(f"{where}: 'max-train-bytes' must be >= 0")
        if self.nproc < 1:
            raise ConfigError(f"{where}: 'nproc' must be >= 1")
        if self.tokenizer_sample_bytes <= 0:
            raise ConfigError(f"{where}: 'tokenizer-sample-bytes' must be > 0")

    @property
    def kind(self) -> str:
        """``hf``, ``builtin``, one of :data:`LOCAL_KINDS`: how :mod:`dept.data.corpus` reads it."""
        prefixed = (kind for prefix, kind in PREFIXED_KINDS.items() if self.path.startswith(prefix))
        path = Path(self.path)
        return next(prefixed, folder_kind(path) if path.is_dir() else "files")

    @property
    def is_local(self) -> bool:
        return self.kind in LOCAL_KINDS


DEFAULT_SOURCES: tuple[dict[str, Any], ...] = (
    {
        "name": "python-stdlib",
        "path": "builtin:python-stdlib",
        "vocab-size": 2048,
        "max-train-bytes": 1_500_000,
    },
    {"name": "synth-latin", "path": "builtin:synthetic-latin", "vocab-size": 1024},
    {"name": "synth-cyrillic", "path": "builtin:synthetic-cyrillic", "vocab-size": 1024},
    {"name": "synth-greek", "path": "builtin:synthetic-greek", "vocab-size": 1024},
)


def parse_source(
    entry: dict[str, Any], base: Path, defaults: dict[str, Any] | None = None
) -> SourceSpec:
    """Validate one sources-file entry; local paths become absolute against ``base``.
    ``defaults`` (kebab-case keys) replace :class:`SourceSpec`'s for the keys ``entry`` omits."""
    where = f"source {entry.get('name', '?')!r}"
    spec = build_structured(SourceSpec, [defaults or {}, entry], where=where)
    if spec.is_local:
        path = Path(spec.path).expanduser()
        spec.path = str(path if path.is_absolute() else (base / path).resolve())
    return spec


def load_sources(
    sources_file: Path | None, defaults: dict[str, Any] | None = None
) -> list[SourceSpec]:
    """The run's sources: from ``sources_file`` or, when None, the built-in offline default;
    ``defaults`` as in :func:`parse_source` (``dept compare`` gives the global vocab-size)."""
    if sources_file is None:
        return [parse_source(dict(e), Path.cwd(), defaults) for e in DEFAULT_SOURCES]
    if not sources_file.is_file():
        raise ConfigError(f"config key 'sources-file': {sources_file} does not exist")
    where = f"sources file {sources_file}"
    entries = _source_entries(_read_yaml(sources_file), where)
    specs = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{where}: each source must be a mapping (entry {number} is {_kind_of(entry)})"
            )
        try:
            specs.append(parse_source(entry, sources_file.parent, defaults))
        except ConfigError as exc:  # omegaconf adds its own key and type lines below the first
            raise ConfigError(f"{where}: {str(exc).splitlines()[0]}") from exc
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{where}: duplicate names {', '.join(duplicates)}")
    return specs


def write_sources(path: Path, specs: list[SourceSpec]) -> None:
    """A sources file listing ``specs`` that :func:`load_sources` reads back as they are (a
    subset of a run's sources, for a run of its own: their local paths are already absolute)."""
    path.write_text(yaml.safe_dump([{kebab(k): v for k, v in asdict(s).items()} for s in specs]))


def _read_yaml(path: Path) -> Any:
    """The YAML document in ``path``; any failure is one line naming the file."""
    where = f"sources file {path}"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read ({exc.strerror or exc})") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} {decode_error_text(exc)}") from exc
    try:
        return yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {_yaml_problem(exc)}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's problem and where it is, on one line (its own text spans several)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or not exc.problem:
        return one_line(str(exc))
    problem = exc.problem + _at(exc.problem_mark)
    if exc.context:
        problem += f" ({exc.context}{_at(exc.context_mark)})"
    return one_line(problem)


def _at(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def _source_entries(data: Any, where: str) -> list[Any]:
    """The source entries of a parsed sources file: a list, or ``sources:`` in a mapping."""
    entries = data.get("sources") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        holder = "its 'sources:' holds" if isinstance(data, dict) else "it holds"
        raise ConfigError(
            f"{where}: expected a non-empty list of sources; {holder} {_kind_of(entries)}"
        )
    return entries


def _kind_of(value: Any) -> str:
    """``value`` as a message describes what was found instead of a source."""
    if value is None:
        return "nothing"
    if isinstance(value, list) and not value:
        return "an empty list"
    return f"the {type(value).__name__} {one_line(repr(value), 40)}"


def run_sources(cfg: DeptConfig) -> list[SourceSpec]:
    """The sources the run config declares (its sources file, or the built-in default); a
    problem with the file is named with its config key."""
    if not cfg.sources_file:
        return load_sources(None)
    try:
        return load_sources(resolve_path(cfg.sources_file))
    except ConfigError as exc:
        if str(exc).startswith("config key"):
            raise
        raise ConfigError(f"config key 'sources-file': {exc}") from exc


def folder_kind(folder: Path) -> str:
    """How a local folder is read: ``dir`` (it has ``train.txt``: with ``val.txt``, the two
    splits), ``saved`` (``datasets``' save_to_disk wrote it), ``mds`` (MDS shards, in it or in
    split subfolders) or ``folder`` (the data files in it and below it, validation held out
    of them)."""
    if (folder / SPLIT_FILES[0]).is_file():
        return "dir"
    if (folder / SAVED_DICT).is_file() or all((folder / f).is_file() for f in SAVED_DATASET):
        return "saved"
    if mds.is_mds(folder) or mds.split_folders(folder):
        return "mds"
    return "folder"


def mds_splits(spec: SourceSpec) -> tuple[Path, Path | None]:
    """The MDS folders an ``mds`` source reads: its ``split`` subfolder (else the folder
    itself, where it is one MDS folder), and its ``val-split`` subfolder where given."""
    root = Path(spec.path)
    splits = mds.split_folders(root)
    listed = f"(its splits: {', '.join(splits)})" if splits else "(it is one MDS folder, no splits)"
    for key, split in (("split", spec.split), ("val-split", spec.val_split)):
        if split and split not in splits and (key == "val-split" or not mds.is_mds(root)):
            raise ConfigError(
                f"source {spec.name!r}: {root} has no MDS split {split!r} {listed}; set {key!r}"
            )
    train = root / spec.split if spec.split in splits else root
    return train, root / spec.val_split if spec.val_split else None


def source_files(spec: SourceSpec) -> list[Path]:
    """The local files a source of :data:`LOCAL_KINDS` reads, in the order they are read."""
    kind, path = spec.kind, Path(spec.path)
    if kind == "dir":
        files = [path / name for name in SPLIT_FILES]
        for file in files:
            if not file.is_file():
                raise ConfigError(
                    f"source {spec.name!r}: {file} is missing (a folder with train.txt is "
                    "read as train.txt and val.txt)"
                )
        return files
    if kind == "saved":
        return sorted(_visible_files(path))
    if kind == "mds":
        folders = [f for f in mds_splits(spec) if f is not None]
        try:
            shards = [shard.file for folder in folders for shard in mds.shards(folder)]
            return [folder / mds.INDEX for folder in folders] + shards
        except mds.MdsError as exc:
            raise ConfigError(f"source {spec.name!r}: {exc}") from None
    if kind == "folder":
        return _data_files(spec, path)
    matches = sorted(Path("/").glob(spec.path.lstrip("/")))
    if not matches:
        raise ConfigError(f"source {spec.name!r}: no file matches {spec.path}")
    return matches


def _data_files(spec: SourceSpec, folder: Path) -> list[Path]:
    """The data files of a ``folder`` source: every file of one :data:`BUILDER_BY_SUFFIX`
    format in it and below it, in name order; files of other kinds (a README, a licence) are
    passed over, and a folder holding two formats is refused (which one is meant?)."""
    by_suffix: dict[str, list[Path]] = {}
    for path in _visible_files(folder):
        if path.suffix.lower() in BUILDER_BY_SUFFIX:
            by_suffix.setdefault(path.suffix.lower(), []).append(path)
    formats = {BUILDER_BY_SUFFIX[suffix] for suffix in by_suffix}
    if not by_suffix:
        raise ConfigError(
            f"source {spec.name!r}: {folder} holds no data to read: no train.txt and val.txt, "
            f"no datasets save_to_disk folder, no {'/'.join(BUILDER_BY_SUFFIX)} files"
        )
    if len(formats) > 1:
        counts = ", ".join(f"{len(files)} {suffix}" for suffix, files in sorted(by_suffix.items()))
        raise ConfigError(
            f"source {spec.name!r}: {folder} holds files of several formats ({counts}); "
            f"name the ones to read with a glob, e.g. path: {folder}/**/*{min(by_suffix)}"
        )
    return sorted(p for files in by_suffix.values() for p in files)


def _visible_files(folder: Path) -> list[Path]:
    """The files in ``folder`` and below it, hidden ones (and those in hidden folders) left
    out: a ``.cache`` or ``.git`` inside a corpus is not its data."""
    return [
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]


def check_source_paths(specs: list[SourceSpec]) -> None:
    """Fail early, naming source and file, when a local source's files are missing or bad.

    Only the start of each file is read (sources may be many GB); deeper problems surface,
    in the same form, when the data is loaded (:mod:`dept.data.corpus`).
    """
    for spec in specs:
        if not spec.is_local:
            continue
        for path in source_files(spec):
            problem = file_problem(path)
            if problem:
                raise ConfigError(f"source {spec.name!r}: {path} {problem}")
        if spec.kind == "mds":
            check_mds_text(spec)


def check_mds_text(spec: SourceSpec) -> None:
    """Refuse an ``mds`` source whose ``text-column`` is missing or not text, naming it."""
    for folder in (f for f in mds_splits(spec) if f is not None):
        try:
            mds.check_text_column(folder, spec.text_column)
        except mds.MdsError as exc:
            raise ConfigError(f"source {spec.name!r}: {exc}") from None


def check_nproc(cfg: DeptConfig, spec: SourceSpec) -> None:
    """Each of ``nproc`` processes takes an equal share of every micro-batch's rows."""
    if cfg.batch_size % spec.nproc:
        raise ConfigError(
            f"source {spec.name!r} key 'nproc' ({spec.nproc}): config key 'batch-size' "
            f"({cfg.batch_size}) must be a multiple of it (each process takes batch-size / "
            "nproc rows of every micro-batch)"
        )
