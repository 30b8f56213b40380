"""Each round's metrics mirrored into TensorBoard and Weights & Biases, where the config asks.

The trackers show what ``metrics.jsonl`` holds, the lines the report writes from the
strategy's :class:`~dept_strategy.history.RunHistory` (never recomputed): one scalar per
number of a round's line, ``round/<key>`` for the round's own (``round/avg_val_bpb``,
``round/bytes_up``) and ``<key>/<source>`` per source (``val_bpb/de-novels``, ``train_loss/...``,
``tokens_per_s/...``, ``bytes_up/...``), plus the learning rates of a training round:
``lr/inner`` (the schedule's at the round's first step) and ``lr/outer``. The step is the
round (0 = before training), as in ``metrics.jsonl``. A number the round lacks (a source not
evaluated in a middle round) is left out rather than written as NaN.

A resumed run writes into the same TensorBoard folder, purging what an earlier attempt wrote
after the checkpoint it resumes from, and into the same W&B run (its id is the run id),
skipping steps that run already holds.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from dept.config import DeptConfig, to_run_config
from dept.train.local import lr_at

log = logging.getLogger(__name__)
TENSORBOARD_DIR = "tensorboard"  # in output-dir


class Tracker(Protocol):
    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self, failed: bool) -> None: ...


class TensorBoard:
    """Event files in one folder for the whole run, whatever the number of attempts."""

    def __init__(self, folder: Path, resumed_after: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # A resumed attempt hides what the one before it logged past its checkpoint.
        purge_step = resumed_after + 1 if resumed_after >= 0 else None
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge_step)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a crash later loses nothing of this round

    def close(self, failed: bool) -> None:
        self.writer.close()


class WandbRun:
    """One W&B run per DEPT run, its id and name the run id, its config the run config.

    W&B takes its mode from the environment of each start, so a run begun with
    ``WANDB_MODE=offline`` and resumed as printed (``dept run --resume``) would go online,
    and stop without a login. A resumed run whose earlier attempts were all offline stays
    offline unless ``WANDB_MODE`` says otherwise."""

    def __init__(
        self, project: str, run_id: str, out_dir: Path, cfg: DeptConfig, resumed: bool
    ) -> None:
        import wandb

        folder = Path(os.environ.get("WANDB_DIR") or out_dir)  # read now, not at wandb's setup
        mode: Literal["offline"] | None = None
        if resumed and "WANDB_MODE" not in os.environ and _offline_so_far(folder, run_id):
            log.info(
                "W&B run %s was offline so far: resumed offline (WANDB_MODE changes it)", run_id
            )
            mode = "offline"
        self.run = wandb.init(
            project=project,
            id=run_id,
            name=run_id,
            resume="allow",
            config=to_run_config(cfg),
            dir=str(folder),
            mode=mode,
        )

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        if step < self.run.step:  # a resumed run that already holds it (W&B would drop it)
            log.info("W&B run %s already holds round %d: not logged again", self.run.id, step)
            return
        self.run.log(dict(scalars), step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class Trackers:
    """The trackers the config turns on (possibly none), fed one round at a time."""

    def __init__(self, cfg: DeptConfig, out_dir: Path, run_id: str, resumed_after: int) -> None:
        """``resumed_after``: the round of the checkpoint a resumed run starts from, -1 for a
        new run. One tracker that fails to open (W&B unreachable) closes those opened."""
        self.cfg = cfg
        self.open: list[Tracker] = []
        try:
            if cfg.tensorboard:
                self.open.append(TensorBoard(out_dir / TENSORBOARD_DIR, resumed_after))
            if cfg.wandb_project:
                resumed = resumed_after >= 0
                self.open.append(WandbRun(cfg.wandb_project, run_id, out_dir, cfg, resumed))
        except BaseException:
            self.close(failed=True)
            raise

    def log(self, line: Mapping[str, Any]) -> None:
        """Write one round: ``line`` is its line of ``metrics.jsonl``."""
        if not self.open:
            return
        scalars = round_scalars(line, self.cfg)
        for tracker in self.open:
            tracker.log(scalars, line["round"])

    def close(self, failed: bool = False) -> None:
        """Flush and close each tracker once (``failed``: the run stopped with an error)."""
        while self.open:
            self.open.pop().close(failed)


def _offline_so_far(folder: Path, run_id: str) -> bool:
    """Whether W&B's folder holds offline attempts of ``run_id`` and no online one (W&B
    names them ``offline-run-<time>-<id>`` and ``run-<time>-<id>``)."""
    attempts = [p.name for p in (folder / "wandb").glob(f"*run-*-{run_id}")]
    return bool(attempts) and all(name.startswith("offline-run-") for name in attempts)


def round_scalars(line: Mapping[str, Any], cfg: DeptConfig) -> dict[str, float]:
    """The finite numbers of a ``metrics.jsonl`` line, by tracker name (module docstring)."""
    scalars: dict[str, float] = {
        f"round/{key}": value for key, value in line.items() if key != "round" and _finite(value)
    }
    for source, metrics in line["sources"].items():
        scalars.update(
            {f"{key}/{source}": value for key, value in metrics.items() if _finite(value)}
        )
    if line["round"] > 0:
        scalars["lr/inner"] = lr_at(line["global_step"], cfg)
        scalars["lr/outer"] = cfg.outer_lr
    return scalars


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
