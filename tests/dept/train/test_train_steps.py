"""A training step reads its loss back from the device once, however many micro-batches."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dept.config import load_config
from dept.model.build import build_model
from dept.train.local import Progress, _accumulate, next_token_loss
from server_app.local_runtime import free_port
from tests.helpers import debug_run_config


def test_micro_batch_losses_add_up_on_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(debug_run_config(tmp_path, **{"grad-accum-steps": 3}))
    model = build_model("debug", 50, 16, seed=0)
    micro = [np.random.default_rng(i).integers(0, 50, (2, 17)) for i in range(3)]
    with torch.no_grad():
        want = sum(next_token_loss(model, torch.from_numpy(b)) for b in micro) / 3

    def no_sync(self: torch.Tensor) -> float:
        raise AssertionError("a micro-batch's loss was read back from the device")

    with monkeypatch.context() as patched:
        patched.setattr(torch.Tensor, "item", no_sync)
        loss = _accumulate(model, iter(micro), cfg, Progress(cfg, "test", 0), 0, None)

    assert loss.shape == () and not loss.requires_grad
    assert torch.allclose(loss, want)


def test_a_step_exchanges_gradients_once_whatever_its_micro_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DDP all-reduces at every backward unless told not to: a step of three micro-batches
    must exchange what one backward does, not three times that (counted by a comm hook on a
    one-process group)."""
    cfg = load_config(debug_run_config(tmp_path, **{"grad-accum-steps": 3}))
    micro = [np.random.default_rng(i).integers(0, 50, (2, 17)) for i in range(4)]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    exchanges: list[int] = []

    def count(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        exchanges.append(1)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    try:
        model = DistributedDataParallel(build_model("debug", 50, 16, seed=0))
        model.register_comm_hook(None, count)
        _accumulate(model, iter(micro[:3]), cfg, Progress(cfg, "test", 0), 0, None)  # type: ignore[arg-type]
        step = len(exchanges)
        next_token_loss(model, torch.from_numpy(micro[3])).backward()  # type: ignore[arg-type]
        one_backward = len(exchanges) - step
    finally:
        dist.destroy_process_group()
    assert step == one_backward >= 1
