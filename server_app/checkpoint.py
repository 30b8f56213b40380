"""Server checkpoints: one per round, written atomically, verified on load, never pickled.

Layout under ``output-dir/checkpoints/``::

    round-0003/tensors.safetensors   θ (+ φ), the outer optimizer's tensors, TRIM's V_k
    round-0003/state.json            round, run id, run config, RNG states, optimizer scalars,
                                     metrics history, and the SHA-256 of tensors.safetensors

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash
while writing leaves no ``round-*`` folder half written. Loading checks the digest; a
checkpoint that fails (truncated, edited, unreadable) is reported by path and the one before
it is used. The last ``KEEP`` checkpoints are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dept.workspace import replace_dir
from server_app.report import dumps

log = logging.getLogger(__name__)
CHECKPOINTS = "checkpoints"
TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
KEEP = 3


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was required; the message says what was found."""


@dataclass
class Checkpoint:
    server_round: int
    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]  # includes "run_config" and whatever the strategy saved
    path: Path


def save_checkpoint(
    out_dir: Path, server_round: int, tensors: dict[str, torch.Tensor], state: dict[str, Any]
) -> Path:
    root = out_dir / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"round-{server_round:04d}"
    tmp = root / f".tmp-round-{server_round:04d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / TENSORS_FILE)
    )
    record = {**state, "round": server_round, "tensors_sha256": _sha256(tmp / TENSORS_FILE)}
    (tmp / STATE_FILE).write_text(dumps(record))
    replace_dir(tmp, final)  # a rerun of this round after a resume: the new one wins
    for old in _round_dirs(root)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest(out_dir: Path) -> Checkpoint | None:
    """The newest checkpoint that verifies; None if there is none at all."""
    root = out_dir / CHECKPOINTS
    candidates = _round_dirs(root) if root.is_dir() else []
    problems = []
    for path in reversed(candidates):
        try:
            return _load(path)
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
            problems.append(f"{path}: {exc}")
            log.error("checkpoint %s is unusable (%s); trying the one before", path, exc)
    if problems:
        raise CheckpointError("no usable checkpoint: " + "; ".join(problems))
    return None


def _load(path: Path) -> Checkpoint:
    state_path, tensors_path = path / STATE_FILE, path / TENSORS_FILE
    state = json.loads(state_path.read_text())
    if _sha256(tensors_path) != state.get("tensors_sha256"):
        raise ValueError(f"{tensors_path.name} does not match its recorded SHA-256")
    return Checkpoint(int(state["round"]), load_file(str(tensors_path)), state, path)


def _round_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("round-*") if p.is_dir())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
