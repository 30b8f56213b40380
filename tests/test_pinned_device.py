"""Tests run on the CPU unless marked ``gpu``, even on a machine with CUDA."""

import os
from pathlib import Path

import pytest
import torch

from dept.config import load_config
from dept.train.devices import resolve_device
from tests.helpers import debug_run_config


def test_a_test_sees_no_cuda_and_its_configs_say_cpu(tmp_path: Path) -> None:
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "", "nor does a process it starts"
    assert resolve_device("auto") == torch.device("cpu")
    assert load_config(debug_run_config(tmp_path)).device == "cpu"


@pytest.mark.gpu
def test_a_gpu_test_sees_cuda() -> None:
    assert torch.cuda.is_available()
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != ""
