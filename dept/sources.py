"""Data sources: what a source is, the sources file that lists them, and the built-in default.

A sources file is YAML, either a list of entries or a mapping with a ``sources:`` list::

    sources:
      - name: de-novels
        path: ../shared/corpora/de-novels   # a folder with train.txt and val.txt
        vocab-size: 4096
      - name: wiki-fr
        path: hf:wikimedia/wikipedia         # a Hugging Face dataset
        config: 20231101.fr
        streaming: true
        max-train-bytes: 50000000

Relative ``path`` values resolve against the folder of the sources file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dept.config import ConfigError, DeptConfig, build_structured, resolve_path
from dept.vocab import MIN_VOCAB_SIZE

HF_PREFIX = "hf:"
BUILTIN_PREFIX = "builtin:"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SAMPLE_BY = ("line", "paragraph", "document")


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

    def __post_init__(self) -> None:
        where = f"source {self.name!r}"
        if not NAME_PATTERN.match(self.name):
            raise ConfigError(f"{where}: 'name' must match {NAME_PATTERN.pattern}")
        if not self.path:
            raise ConfigError(f"{where}: 'path' is required")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ConfigError(f"{where}: 'vocab-size' must be >= {MIN_VOCAB_SIZE}")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"{where}: 'val-fraction' must be in (0, 1)")
        if self.sample_by not in SAMPLE_BY:
            raise ConfigError(f"{where}: 'sample-by' must be one of {', '.join(SAMPLE_BY)}")
        if self.max_train_bytes < 0:
            raise ConfigError(f"{where}: 'max-train-bytes' must be >= 0")

    @property
    def kind(self) -> str:
        """``hf``, ``builtin``, ``dir`` or ``files``."""
        if self.path.startswith(HF_PREFIX):
            return "hf"
        if self.path.startswith(BUILTIN_PREFIX):
            return "builtin"
        return "dir" if Path(self.path).is_dir() else "files"


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


def parse_source(entry: dict[str, Any], base: Path) -> SourceSpec:
    """Validate one sources-file entry; local paths become absolute against ``base``."""
    where = f"source {entry.get('name', '?')!r}"
    spec = build_structured(SourceSpec, [entry], where=where)
    if spec.kind in ("dir", "files"):
        path = Path(spec.path).expanduser()
        spec.path = str(path if path.is_absolute() else (base / path).resolve())
    return spec


def load_sources(sources_file: Path | None) -> list[SourceSpec]:
    """The run's sources: from ``sources_file`` or, when None, the built-in offline default."""
    if sources_file is None:
        return [parse_source(dict(e), Path.cwd()) for e in DEFAULT_SOURCES]
    if not sources_file.is_file():
        raise ConfigError(f"config key 'sources-file': {sources_file} does not exist")
    data = yaml.safe_load(sources_file.read_text(encoding="utf-8"))
    entries = data.get("sources") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"sources file {sources_file}: expected a non-empty list of sources")
    specs = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise ConfigError(f"sources file {sources_file}: each source must be a mapping")
        specs.append(parse_source(entry, sources_file.parent))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"sources file {sources_file}: duplicate names {', '.join(duplicates)}")
    return specs


def run_sources(cfg: DeptConfig) -> list[SourceSpec]:
    """The sources the run config declares (its sources file, or the built-in default)."""
    return load_sources(resolve_path(cfg.sources_file) if cfg.sources_file else None)


def check_source_paths(specs: list[SourceSpec]) -> None:
    """Fail early, naming the source, when a local source's files are missing."""
    for spec in specs:
        if spec.kind == "dir":
            for split_file in ("train.txt", "val.txt"):
                if not (Path(spec.path) / split_file).is_file():
                    raise ConfigError(f"source {spec.name!r}: {spec.path}/{split_file} is missing")
        elif spec.kind == "files" and not sorted(Path("/").glob(spec.path.lstrip("/"))):
            raise ConfigError(f"source {spec.name!r}: no file matches {spec.path}")
