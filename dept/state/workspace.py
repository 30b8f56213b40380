"""What a source keeps on its own node, between rounds and across restarts.

Layout under the node's state root (``state-dir``)::

    cache/tokenizers/<name>-<hash>/tokenizer.json   trained once, reused by every run
    cache/tokens/<name>/tokens-<hash>/              tokenized splits (train.bin,
                                                    validation.bin, meta.json), memory-mapped
    cache/synthetic/...                             generated built-in corpora
    runs/<run-id>/<source>/vocab_ids.npy            V_k (SPEC, TRIM)
    runs/<run-id>/<source>/download-body.safetensors
                                                    download-compression: the body the server
                                                    last sent it, its digest in the metadata
                                                    (dept.train.held_body)
    runs/<run-id>/<source>/round-0007/              the source's state after training round 7:
        embeddings.safetensors                      φ_k rows the node owns, and ψ_k (SPEC, SPEC-OPT)
        optimizer.pt                                inner AdamW state (weights_only load)
        residual.safetensors                        what its compressed update lost (error
                                                    feedback), added to its next update
        body.safetensors                            fragments > 1: its trained body
                                                    (local/...) and each fragment's base (base/...)
        progress.json                               where the training stream stands, the
                                                    tokenizer the embeddings belong to, and
                                                    the SHA-256 of each file beside it

State is kept per round (the last ``KEEP_ROUNDS``): training round t starts from the newest
state before t. A server that crashed after its clients trained round t but before its own
checkpoint of t resumes from t-1 and re-runs round t; the clients then start again from the
same state, so the resumed run is the uninterrupted one. Every file and folder is written
under a temporary name and renamed, so a crash never leaves half a state; a state damaged
anyway (a truncated file, a disk error, an edit: any file that no longer matches its
SHA-256) is passed over for the newest good one before it, and the reason is kept so the
source can report it.
"""

from __future__ import annotations

import functools
import json
import logging
import pickle
import re
import shutil
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dept.config import DeptConfig
from dept.data.corpus import SourceText, load_source_text, text_sample
from dept.data.fingerprint import digest
from dept.data.sources import GLOBAL_SAMPLE_BYTES, SourceSpec
from dept.data.token_stream import StreamPosition
from dept.data.vocab import ensure_tokenizer
from dept.model.families import INIT_STD
from dept.model.variants import variant
from dept.state.files import file_sha256, remove_abandoned_writes, replace_dir, save_tensors
from dept.state.write_behind import WriteBehind

EMBEDDINGS_FILE = "embeddings.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
RESIDUAL_FILE = "residual.safetensors"
BODY_FILE = "body.safetensors"
PROGRESS_FILE = "progress.json"
PRUNED_FILE = "pruned.json"  # the newest round whose state was deleted to save space
VOCAB_IDS_FILE = "vocab_ids.npy"
KEEP_ROUNDS = 4  # the server keeps 3 checkpoints: a fallback to the oldest still finds one
ROUND_DIR = re.compile(r"round-(\d{4})")  # a stray "round-0001.bak" is not a round's state
# What reading a damaged state raises (truncated JSON, safetensors or torch zip, a lost file).
STATE_ERRORS = (
    OSError,
    EOFError,
    ValueError,
    KeyError,
    TypeError,
    RuntimeError,
    pickle.UnpicklingError,
    SafetensorError,
)
log = logging.getLogger(__name__)


def cache_dir(root: Path) -> Path:
    """Where a node keeps what every run may reuse: tokenizers, token streams, corpora."""
    return root / "cache"


class Workspace:
    """The node-local folders of one source in one run."""

    # Set by the node's warm worker (client_app.worker), a long-lived process: states are
    # written behind the reply and kept in memory for the next round (dept.state.write_behind).
    write_behind = False

    def __init__(self, root: Path, run_id: str, source: str) -> None:
        self.root = root
        self.cache = cache_dir(root)
        self.dir = root / "runs" / run_id / source
        self.dir.mkdir(parents=True, exist_ok=True)
        self._behind: WriteBehind[SourceState] = WriteBehind()

    def load_state(
        self,
        before_round: int,
        attempt: Attempt | None = None,
        required: tuple[str, ...] = (),
        consume: bool = False,
    ) -> FoundState:
        """The newest usable state saved after a round before ``before_round`` (None before
        the source's first round, or when every kept state is unusable), and why newer
        rounds were passed over.

        ``attempt`` is the server's current attempt at the run (None: read as it is, e.g. to
        export): a state of a round after the one it resumed after, written by an earlier
        attempt, comes from a crashed server's round that is being re-run, so it is dropped.
        ``required``: files a complete state has (e.g. ``EMBEDDINGS_FILE``, ``OPTIMIZER_FILE``
        where the run keeps them); a state without one of them is passed over.

        A state written behind (:attr:`write_behind`) is waited for, then given from memory
        where it is the one the disk would give; ``consume``: the caller changes its tensors
        in place (the optimizer's moments), so the next load reads the files.
        """
        failed, lost = self._behind.wait(), self._behind.lost
        # a lost write counts only where its state is one this load could have given: not a
        # round being re-run (or after it), nor a crashed attempt's round a resume drops
        unusable = []
        if (
            lost is not None
            and lost.server_round < before_round
            and self._of_attempt(lost, attempt)
        ):
            unusable.append(f"the newest state could not be written: {failed}")
        kept = self._behind.kept
        if kept is not None and self._kept_is_newest(kept, before_round, attempt):
            if consume:
                self._behind.take()
            return FoundState(kept)
        for server_round in reversed([r for r in self._saved_rounds() if r < before_round]):
            folder = self._round_dir(server_round)
            try:
                progress = json.loads((folder / PROGRESS_FILE).read_text())
                if (
                    attempt is not None
                    and server_round > attempt.resumed_after
                    and progress.get("attempt") != attempt.id
                ):
                    shutil.rmtree(folder, ignore_errors=True)
                    continue
                state = self._read(folder, server_round, progress, required)
            except STATE_ERRORS as exc:
                why = f"round {server_round}: {type(exc).__name__}: {exc}".splitlines()[0]
                log.warning("%s: passing over the unusable state of %s", self.dir, why)
                unusable.append(why)
                continue
            return FoundState(state, tuple(unusable))
        pruned = self._pruned_through()
        if pruned is not None and pruned < before_round:
            unusable.append(f"the states up to round {pruned} were pruned")
        return FoundState(None, tuple(unusable))

    def _read(
        self, folder: Path, server_round: int, progress: dict[str, Any], required: tuple[str, ...]
    ) -> SourceState:
        embeddings, optimizer = folder / EMBEDDINGS_FILE, folder / OPTIMIZER_FILE
        residual, body = folder / RESIDUAL_FILE, folder / BODY_FILE
        for name in required:
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder / name} is missing")
        for name, recorded in progress.get("sha256", {}).items():  # none in older states
            if file_sha256(folder / name) != recorded:
                raise ValueError(f"{folder / name} does not match its SHA-256: damaged")
        return SourceState(
            server_round=server_round,
            embeddings=load_file(str(embeddings)) if embeddings.is_file() else {},
            optimizer=(
                torch.load(optimizer, map_location="cpu", weights_only=True)
                if optimizer.is_file()
                else None
            ),
            position=StreamPosition(**progress["position"]),
            tokenizer=progress["tokenizer"],
            attempt=progress.get("attempt", ""),
            residual=load_file(str(residual)) if residual.is_file() else {},
            device=progress.get("device", ""),
            body=load_file(str(body)) if body.is_file() else {},
            body_versions=tuple(progress.get("body_versions", ())),
        )

    def _kept_is_newest(
        self, kept: SourceState, before_round: int, attempt: Attempt | None
    ) -> bool:
        """Whether the state kept in memory is the one the files would give now."""
        saved = [r for r in self._saved_rounds() if r < before_round]
        return bool(saved) and saved[-1] == kept.server_round and self._of_attempt(kept, attempt)

    @staticmethod
    def _of_attempt(state: SourceState, attempt: Attempt | None) -> bool:
        """Whether ``state`` stands in ``attempt``: written by it, or in a round before the
        checkpoint it resumed after (a crashed attempt's later rounds are re-run)."""
        return (
            attempt is None
            or state.server_round <= attempt.resumed_after
            or state.attempt == attempt.id
        )

    def save_state(self, server_round: int, state: SourceState, base: int | None = None) -> None:
        """Write the state after ``server_round`` (atomically), keep the last few and the
        state of round ``base``, the one this round started from: it is the server's view of
        the source until the server takes a newer update, so a node whose replies are
        refused for more rounds than it keeps (a server out of disk) still goes on from it.
        With :attr:`write_behind` the files are written by a thread while the caller goes
        on (a worker killed before they are complete loses this round's state: the next
        round falls back to the one before and says so)."""
        if not self.write_behind:
            self._write_state(server_round, state, base)
            return
        write = functools.partial(self._write_state, server_round, state, base)
        self._behind.start(write, state, name=f"state-{self.dir.name}-{server_round}")

    def _write_state(self, server_round: int, state: SourceState, base: int | None) -> None:
        tmp = self.dir / f".tmp-round-{server_round:04d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        files = (state.embeddings, EMBEDDINGS_FILE), (state.residual, RESIDUAL_FILE)
        for tensors, name in (*files, (state.body, BODY_FILE)):
            if tensors:
                save_tensors(tensors, tmp / name)
        if state.optimizer is not None:
            torch.save(state.optimizer, tmp / OPTIMIZER_FILE)
        progress = {
            "position": asdict(state.position),
            "tokenizer": state.tokenizer,
            "attempt": state.attempt,
            "device": state.device,
            # a tensor file can be damaged in place and still read (safetensors checks
            # its header, not its data): each is checked against this on load
            "sha256": {p.name: file_sha256(p) for p in sorted(tmp.iterdir())},
            **({"body_versions": list(state.body_versions)} if state.body else {}),
        }
        (tmp / PROGRESS_FILE).write_text(json.dumps(progress))
        replace_dir(tmp, self._round_dir(server_round))
        remove_abandoned_writes(self.dir, server_round)
        stale = [r for r in self._saved_rounds()[:-KEEP_ROUNDS] if r != base]
        if stale:
            _atomic(self.dir / PRUNED_FILE, lambda t: t.write_text(json.dumps(max(stale))))
        for old in stale:
            shutil.rmtree(self._round_dir(old), ignore_errors=True)

    def _pruned_through(self) -> int | None:
        path = self.dir / PRUNED_FILE
        try:
            return int(json.loads(path.read_text())) if path.is_file() else None
        except STATE_ERRORS:  # only a hint for the report: a damaged one says nothing
            return None

    def _round_dir(self, server_round: int) -> Path:
        return self.dir / f"round-{server_round:04d}"

    def _saved_rounds(self) -> list[int]:
        found = (ROUND_DIR.fullmatch(p.name) for p in self.dir.glob("round-*") if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def load_vocab_ids(self) -> np.ndarray | None:
        path = self.dir / VOCAB_IDS_FILE
        return np.load(path, allow_pickle=False) if path.is_file() else None

    def save_vocab_ids(self, ids: np.ndarray) -> None:
        _atomic(self.dir / VOCAB_IDS_FILE, lambda tmp: np.save(tmp, ids, allow_pickle=False))


@dataclass(frozen=True)
class Attempt:
    """One start of the server on a run: a fresh one, or a resume after round
    ``resumed_after`` (-1: a fresh start)."""

    id: str = ""
    resumed_after: int = -1


@dataclass(frozen=True)
class FoundState:
    """What :meth:`Workspace.load_state` found."""

    state: SourceState | None
    unusable: tuple[str, ...] = ()  # why newer saved rounds were passed over, newest first


@dataclass
class SourceState:
    """What a source carries from one of its rounds to the next."""

    server_round: int
    embeddings: dict[str, torch.Tensor]  # φ_k rows (and ψ_k) the node owns; none for GLOB
    optimizer: dict[str, Any] | None  # inner AdamW state_dict, when kept
    position: StreamPosition
    tokenizer: str  # digest of the tokenizer φ_k was trained for
    attempt: str = ""  # the server attempt (start or resume) whose round wrote it
    # what the round's compressed update lost, added to the next one (error feedback)
    residual: dict[str, torch.Tensor] = field(default_factory=dict)
    device: str = ""  # the kind of device the round trained on: cpu, cuda, mps ("": unknown)
    # fragments > 1 (dept.wire.fragments): "local/<name>" its trained θ, "base/<name>" the global
    # values each fragment started from, at these versions
    body: dict[str, torch.Tensor] = field(default_factory=dict)
    body_versions: tuple[int, ...] = ()


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")  # keeps the suffix np.save wants
    write(tmp)
    tmp.replace(path)


def init_embeddings(
    shapes: dict[str, tuple[int, int]], seed: int, source: str
) -> dict[str, torch.Tensor]:
    """Fresh φ_k (and ψ_k), seeded by run seed and source name (reproducible, distinct per
    source)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(source.encode()))
    return {name: torch.randn(shape, generator=gen) * INIT_STD for name, shape in shapes.items()}


def own_tokenizer(spec: SourceSpec, text: SourceText, cache: Path, seed: int) -> Path:
    """SPEC-OPT: the source's own tokenizer, trained once on a seeded sample of its training
    text of at most ``tokenizer-sample-bytes``.

    Keyed by what the documents are (:attr:`SourceText.key`: content, not where they lie),
    so edited data or a different validation split gets a new tokenizer, a moved one not.
    """
    size = spec.tokenizer_sample_bytes
    key = digest(text.key, spec.vocab_size, seed, size)
    return ensure_tokenizer(
        cache / "tokenizers" / f"{spec.name}-{key}",
        spec.vocab_size,
        text_sample(text.train, size, seed),
    )


def global_tokenizer(specs: list[SourceSpec], vocab_size: int, cache: Path, seed: int) -> Path:
    """SPEC/GLOB/TRIM: one tokenizer trained on every source's training text.

    Each source contributes an equal share of the training sample (at most its
    ``tokenizer-sample-bytes``), so a large source does not crowd the others out of the
    vocabulary.
    """
    texts = [load_source_text(spec, cache, seed) for spec in specs]
    shares = [min(s.tokenizer_sample_bytes, GLOBAL_SAMPLE_BYTES // len(specs)) for s in specs]
    key = digest([t.key for t in texts], vocab_size, seed, shares)
    out = cache / "tokenizers" / f"global-{key}"

    def sample() -> Iterator[str]:
        for text, share in zip(texts, shares, strict=True):
            yield from text_sample(text.train, share, seed)

    return ensure_tokenizer(out, vocab_size, sample())


def required_state_files(cfg: DeptConfig) -> tuple[str, ...]:
    """The files every saved round state of this run has (a state without one is
    incomplete): embeddings but for GLOB, optimizer moments and the compression residual
    where the run keeps them, the body with fragments."""
    files = [EMBEDDINGS_FILE] if variant(cfg.variant).keeps_state else []
    files += [OPTIMIZER_FILE] if cfg.keep_inner_optimizer else []
    feedback = cfg.compression != "none" and cfg.compression_error_feedback
    files += [RESIDUAL_FILE] if feedback else []
    return (*files, *([BODY_FILE] if cfg.fragments > 1 else []))


def check_same_device(
    cfg: DeptConfig, source: str, state: SourceState | None, device_type: str
) -> None:
    """A state trained on another kind of device (a node moved, or ``device='auto'``
    found another) goes on only where the run allows it: the numbers then differ from an
    uninterrupted run's (bf16 autocast and fused AdamW on CUDA)."""
    if state is None or state.device in ("", device_type) or cfg.allow_device_change:
        return
    raise ValueError(
        f"source {source!r}: its state of round {state.server_round} was trained on "
        f"{state.device}, and this node trains on {device_type}: the run would not match an "
        f"uninterrupted one; give the node its {state.device} device, or resume with "
        "-c allow-device-change=true"
    )
