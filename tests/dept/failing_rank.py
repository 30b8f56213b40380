"""A rank module whose rank 1 raises mid-round (``python -m tests.dept.failing_rank FOLDER``):
what :mod:`tests.dept.train.test_distributed` runs in place of :mod:`dept.train.rank_worker`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

import dept.train.source_client
from dept.train import rank_worker

FAIL_AT = 3  # the micro-batch rank 1 fails at
TRAIN_LOCAL = dept.train.source_client.train_local


def failing_train_local(
    model: Any, optimizer: Any, batches: Iterator[np.ndarray], *args: Any, **kwargs: Any
) -> Any:
    """:func:`dept.train.local.train_local` on batches that run out, on rank 1, with an error."""

    def failing() -> Iterator[np.ndarray]:
        for number, batch in enumerate(batches):
            if number == FAIL_AT and os.environ["RANK"] == "1":
                raise RuntimeError(f"injected failure at micro-batch {number}")
            yield batch

    return TRAIN_LOCAL(model, optimizer, failing(), *args, **kwargs)


if __name__ == "__main__":
    dept.train.source_client.train_local = failing_train_local  # type: ignore[assignment]
    rank_worker.main()
