"""One rank of a multi-process source's round: ``python -m dept.train.rank_worker FOLDER``.

:mod:`dept.train.distributed` starts ``nproc`` of these through PyTorch's elastic launcher, which
sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous in the environment. Each
reads the job from ``FOLDER``, builds the source as the node's process does (tokenizer and
tokens from the node's cache) and trains its share of the round (:mod:`dept.train.ranks`); rank 0
writes the result back. An exception is recorded (``@record``) for the launcher to report.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

import datasets
import torch
from torch.distributed.elastic.multiprocessing.errors import record

from dept.config import load_config
from dept.train.distributed import read_job, write_result
from dept.train.ranks import Ranks
from dept.train.source_client import SourceClient

PR_SET_PDEATHSIG = 1  # linux/prctl.h


@record
def main(argv: list[str] | None = None) -> None:
    folder = Path((argv or sys.argv[1:])[0])
    job, arrays = read_job(folder)
    _stop_with(job.launcher_pid)
    torch.set_num_threads(job.threads)
    datasets.disable_progress_bars()
    cfg = load_config(job.run_config)
    ranks = Ranks.join(cfg.data_parallel, job.first_gpu)
    _log_as(ranks)
    try:
        cfg = dataclasses.replace(cfg, device=str(ranks.device))
        spec = job.source()
        client = SourceClient(
            cfg, spec, job.workspace(), [spec], global_tokenizer_file=Path(job.tokenizer_file)
        )
        result = client.train_round(
            arrays,
            job.global_step,
            job.server_round,
            job.round_attempt(),
            job.last_trained,
            announce=job.announce and ranks.writes,
            ranks=ranks,
        )
        if ranks.writes:
            write_result(folder, result)
    finally:
        ranks.close()


def _stop_with(launcher_pid: int) -> None:
    """On Linux, have the kernel kill this rank when its launcher dies: an orphaned rank
    would train on, or wait in a collective, for nothing."""
    if sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher_pid:  # it died before the kernel was told
        raise SystemExit(f"the launcher (pid {launcher_pid}) is gone")


def _log_as(ranks: Ranks) -> None:
    """Rank 0 logs as the node's process would; the others only their errors (their
    warnings would repeat rank 0's)."""
    level = logging.INFO if ranks.writes else logging.ERROR
    fmt = f"%(levelname)s [rank {ranks.rank}/{ranks.world}] %(name)s: %(message)s"
    logging.basicConfig(level=level, format=fmt, force=True)


def _leave() -> None:
    """Exit 0 without the interpreter's finalization, once the round is done and written:
    gloo's worker threads can still hold tensors then, and freeing them while Python tears
    itself down aborted a finished rank (SIGABRT, "terminate called without an active
    exception") in 2 of 20 FSDP test runs on 2 busy cores, failing the round it had done."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _leave()
