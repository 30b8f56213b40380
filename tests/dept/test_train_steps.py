"""A training step reads its loss back from the device once, however many micro-batches."""

from pathlib import Path

import numpy as np
import pytest
import torch

from dept.config import load_config
from dept.model import build_model
from dept.train import Progress, _accumulate, next_token_loss
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
        loss = _accumulate(model, iter(micro), cfg, Progress(cfg, "test", 0), local_step=0)

    assert loss.shape == () and not loss.requires_grad
    assert torch.allclose(loss, want)
