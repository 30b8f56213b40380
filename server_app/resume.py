"""Resuming a run by naming its folder: the config comes from its newest checkpoint.

``dept run --resume OUTPUT_DIR`` needs no retyping of the first run's settings; the only
keys it takes are those a resumed run may change (:data:`RESUME_OPTIONS`). Everything here
reads checkpoints' ``state.json`` only, so it answers in a moment before Flower starts; the
ServerApp verifies the checkpoint's digests when it loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dept.config import ConfigError, DeptConfig, config_keys
from server_app.checkpoint import (
    DEVICE_KEY,
    RESUMABLE_CHANGES,
    check_same_run,
    no_checkpoint,
    saved_run_config,
)

# --resume names both resume and output-dir; a device change needs allow-device-change too
RESUME_OPTIONS = (RESUMABLE_CHANGES | {DEVICE_KEY}) - {"resume", "output-dir"}


def resume_overrides(out_dir: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The checkpointed run's own config, resuming in ``out_dir``, with the ``given`` keys
    that a resumed run may change; a :class:`ConfigError` for any other key, or when
    ``out_dir`` holds no checkpoint."""
    saved = saved_run_config(out_dir)
    if saved is None:
        raise ConfigError(f"--resume: {out_dir} holds no checkpoint of a run to resume")
    refused = sorted(given.keys() - RESUME_OPTIONS)
    if refused:
        raise ConfigError(
            f"--resume takes the run config from the checkpoint; {', '.join(refused)} cannot "
            f"change (only {', '.join(sorted(RESUME_OPTIONS))} can)"
        )
    known = {k.key for k in config_keys()}
    return {
        **{k: v for k, v in saved[1].items() if k in known},
        **given,
        "resume": True,
        "output-dir": str(out_dir),
    }


def check_resumable(cfg: DeptConfig, out_dir: Path) -> None:
    """``resume`` needs a checkpoint of this same run in ``out_dir`` (checked before Flower
    starts; the ServerApp checks the checkpoint's digests when it loads it)."""
    saved = saved_run_config(out_dir)
    if saved is None:
        raise no_checkpoint(out_dir)
    check_same_run(cfg, saved[1])


def check_no_earlier_run(out_dir: Path, force: bool) -> None:
    """A new run (not ``--resume``) would write over the checkpoints of one already in
    ``out_dir``, finished or stopped, and its resume line would point at the mix: refused
    in one line, unless ``force`` (``dept run --force``)."""
    saved = saved_run_config(out_dir)
    if saved is None or force:
        return
    finished = (out_dir / "summary.json").is_file() and saved[0] == saved[1].get(
        "num-server-rounds"
    )
    held = "a finished run" if finished else f"a run checkpointed after round {saved[0]}"
    go_on = "" if finished else f" (dept run --resume {_shown(out_dir)} continues it)"
    raise ConfigError(
        f"output-dir {_shown(out_dir)} holds {held}{go_on}; choose another output-dir, or "
        "start over in it with --force"
    )


def resume_hint(out_dir: Path) -> str:
    """How to go on with the run in ``out_dir``, or "" when it holds no checkpoint."""
    saved = saved_run_config(out_dir)
    if saved is None:
        return ""
    return f"resume after round {saved[0]} with: dept run --resume {_shown(out_dir)}"


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it is below it (shorter to type)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
