"""Server checkpoints: one per round, written atomically, verified on load, never pickled.

Layout under ``output-dir/checkpoints/``::

    round-0003/tensors.safetensors   θ (+ φ), the outer optimizer's tensors, TRIM's V_k
    round-0003/state.json            round, run id, run config, RNG states, optimizer scalars,
                                     metrics history
    round-0003/SHA256SUMS            the SHA-256 of both files (``sha256sum -c`` reads it)

A checkpoint is written into a hidden temporary folder and renamed into place, so a crash
while writing leaves no ``round-*`` folder half written. Loading checks both digests and that
the state has every field a resume needs; a checkpoint that fails (truncated, edited,
incomplete, unreadable, or refused by the caller's own check) is reported by path and the one
before it is used. The last ``KEEP`` checkpoints are kept.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dept.config import ConfigError, DeptConfig, to_run_config
from dept.model.families import model_choice
from dept.state.files import file_sha256, remove_abandoned_writes, replace_dir, save_tensors
from dept.state.strict_json import dumps

if TYPE_CHECKING:  # dept run reads a checkpoint's JSON to resume without torch (a second)
    import torch

log = logging.getLogger(__name__)
CHECKPOINTS = "checkpoints"
TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
DIGESTS_FILE = "SHA256SUMS"
KEEP = 3
REQUIRED_FIELDS = ("round", "run_config", "strategy")
# Keys that may change between an interrupted run and its resumption: they do not change
# what is computed, only how long to wait and where (a moved output folder included).
RESUMABLE_CHANGES = frozenset(
    {
        "resume",
        "output-dir",
        "wait-for-nodes-s",
        "round-timeout-s",
        "min-available-nodes",
        "allow-device-change",
        "source-keys-file",
    }
)
# Keys a resumed run may change only when it says so: the results then differ.
DEVICE_KEY, ALLOW_DEVICE_CHANGE = "device", "allow-device-change"


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
    save_tensors(tensors, tmp / TENSORS_FILE)
    (tmp / STATE_FILE).write_text(dumps({**state, "round": server_round}))
    sums = "".join(f"{file_sha256(tmp / name)}  {name}\n" for name in (STATE_FILE, TENSORS_FILE))
    (tmp / DIGESTS_FILE).write_text(sums)
    replace_dir(tmp, final)  # a rerun of this round after a resume: the new one wins
    remove_abandoned_writes(root, server_round)
    for old in _round_dirs(root)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest(
    out_dir: Path, accept: Callable[[Checkpoint], None] = lambda _: None
) -> Checkpoint | None:
    """The newest checkpoint that verifies and that ``accept`` takes without raising
    (``ValueError``, ``KeyError`` or ``TypeError``: e.g. restoring a strategy from it); None
    if there is none at all."""
    root = out_dir / CHECKPOINTS
    candidates = _round_dirs(root) if root.is_dir() else []
    problems = []
    for path in reversed(candidates):
        try:
            checkpoint = _load(path)
            accept(checkpoint)
            return checkpoint
        except ConfigError:  # the caller refuses the run itself, not this checkpoint
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:  # JSONDecodeError included
            problems.append(f"{path}: {exc!r}")
            log.error("checkpoint %s is unusable (%r); trying the one before", path, exc)
    if problems:
        raise CheckpointError("no usable checkpoint: " + "; ".join(problems))
    return None


def saved_run_config(out_dir: Path) -> tuple[int, dict[str, Any]] | None:
    """The round and run config of the newest checkpoint whose state reads (its digests
    are checked when the run resumes); None when ``out_dir`` holds none. Cheap: the
    tensors are not read."""
    root = out_dir / CHECKPOINTS
    for path in reversed(_round_dirs(root) if root.is_dir() else []):
        try:
            state = json.loads((path / STATE_FILE).read_text())
            return int(state["round"]), dict(state["run_config"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def no_checkpoint(out_dir: Path) -> ConfigError:
    """The error of a run told to resume in ``out_dir``, where no checkpoint is."""
    return ConfigError(
        f"config key 'resume' is true but {out_dir / CHECKPOINTS} holds no checkpoint "
        "(set 'output-dir' to the interrupted run's folder)"
    )


def check_same_run(cfg: DeptConfig, saved: Mapping[str, Any]) -> None:
    """A :class:`ConfigError` naming every key, other than :data:`RESUMABLE_CHANGES`,
    whose value differs from the checkpointed run's (a changed run is not resumed)."""
    now = to_run_config(cfg)
    # a key added since the checkpoint was written had its default then
    saved = {**to_run_config(DeptConfig()), **saved}
    if saved[DEVICE_KEY] != now[DEVICE_KEY] and not now[ALLOW_DEVICE_CHANGE]:
        raise ConfigError(
            f"config key 'device' is {now[DEVICE_KEY]!r}, the checkpointed run's "
            f"{saved[DEVICE_KEY]!r}: on another device the resumed run computes differently "
            "(bf16 autocast and fused AdamW on CUDA) and will not match an uninterrupted one; "
            f"add -c {ALLOW_DEVICE_CHANGE}=true to resume anyway"
        )
    changed = sorted(
        k
        for k in now.keys() - RESUMABLE_CHANGES - {DEVICE_KEY}
        if saved[k] != now[k] and not (k == "model" and _same_model(saved[k], now[k]))
    )
    if changed:
        raise ConfigError(
            f"config key 'resume': {', '.join(changed)} differ from the checkpointed run "
            f"({', '.join(f'{k}={saved[k]!r}' for k in changed)}); a resumed run must be "
            "the same run"
        )


def _same_model(saved: Any, now: str) -> bool:
    """Two names of one model (``tiny`` and ``llama:tiny``) are the same run's."""
    try:
        return model_choice(str(saved)) == model_choice(now)
    except ValueError:  # the saved name no longer parses: a different run
        return False


def _load(path: Path) -> Checkpoint:
    _verify(path)
    state = json.loads((path / STATE_FILE).read_text())
    missing = [f for f in REQUIRED_FIELDS if f not in state] if isinstance(state, dict) else ["*"]
    if missing:
        raise ValueError(f"{STATE_FILE} lacks {', '.join(missing)}")
    if path.name != f"round-{state['round']:04d}":
        raise ValueError(f"{STATE_FILE} says round {state['round']}, its folder {path.name}")
    from safetensors.torch import load_file

    return Checkpoint(int(state["round"]), load_file(str(path / TENSORS_FILE)), state, path)


def _verify(path: Path) -> None:
    """Both files match the digests written with them (an edit or a truncation does not)."""
    recorded = {}
    for line in (path / DIGESTS_FILE).read_text().splitlines():
        digest, _, name = line.partition("  ")
        recorded[name] = digest
    for name in (STATE_FILE, TENSORS_FILE):
        if recorded.get(name) != file_sha256(path / name):
            raise ValueError(f"{name} does not match its SHA-256 in {DIGESTS_FILE}")


def _round_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("round-[0-9][0-9][0-9][0-9]") if p.is_dir())
