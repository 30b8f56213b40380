"""Which device a node trains on: cuda:N, a node's own device, and the warning for GPUs
that go unused (no GPU needed: torch's CUDA queries and the driver's GPU list are faked)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict

from client_app import app as client_app
from client_app import tasks
from client_app.node import node_setup, served_sources
from dept.config import ConfigError, load_config
from dept.train import device_kind, devices
from tests.helpers import debug_run_config


@pytest.fixture
def two_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")


@pytest.fixture
def machine_with_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """A driver that lists 8 GPUs (none of them visible to this process)."""
    for index in range(8):
        (tmp_path / "gpus" / f"0000:{index:02x}:00.0").mkdir(parents=True)
    monkeypatch.setattr(devices, "NVIDIA_GPUS_GLOB", str(tmp_path / "gpus" / "*"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return 8


@pytest.mark.usefixtures("two_visible_gpus")
def test_cuda_n_names_one_of_the_visible_gpus() -> None:
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert devices.resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ConfigError, match=r"'cuda:2' but 2 CUDA device\(s\) are visible here "):
        devices.resolve_device("cuda:2")


def test_cuda_without_a_gpu_is_an_error_not_a_cpu_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="'cuda' but 0 CUDA device"):
        devices.resolve_device("cuda")


def test_a_device_kind_is_torch_s_choice_and_needs_no_torch_without_gpu_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("auto", "cpu"):  # this machine, as torch sees it
        assert device_kind.device_kind(name) == devices.resolve_device(name).type
    monkeypatch.setattr(device_kind.sys, "platform", "linux")
    monkeypatch.setattr(device_kind, "GPU_DEVICE_FILES", (str(tmp_path / "nvidia[0-9]*"),))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # never asked
    assert not device_kind.accelerator_possible()
    assert [device_kind.device_kind(n) for n in ("auto", "cpu", "mps")] == ["cpu", "cpu", "mps"]

    (tmp_path / "nvidia0").touch()  # a driver's device file: torch decides
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert device_kind.accelerator_possible() and device_kind.device_kind("auto") == "cuda"


def test_cuda_on_a_machine_without_gpu_files_is_refused_by_torch_s_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_kind, "GPU_DEVICE_FILES", (str(tmp_path / "none"),))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="'cuda' but 0 CUDA device"):
        device_kind.device_kind("cuda")


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:-1", "CPU", "cuda:0 "])
def test_unknown_device_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"config key 'device' is {name!r}"):
        devices.resolve_device(name)


def test_a_node_device_wins_over_the_run_and_is_checked(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path, device="cuda"))
    node = {"partition-id": 0, "num-partitions": 1}
    source = served_sources(cfg, node)[0][0].name
    assert node_setup(cfg, node, source).device is None
    assert node_setup(cfg, {**node, "device": "cuda:1"}, source).device == "cuda:1"
    with pytest.raises(ConfigError, match="node config key 'device' is 'gpu1'"):
        node_setup(cfg, {**node, "device": "gpu1"}, source)


def test_a_cpu_run_on_a_gpu_machine_says_why_and_how(machine_with_gpus: int) -> None:
    warning = devices.unused_gpus_warning(torch.device("cpu"))
    assert warning is not None
    assert f"this machine has {machine_with_gpus} NVIDIA GPU(s)" in warning
    if torch.version.cuda is None:  # this CPU build of torch says so first
        assert "is a CPU build: install a CUDA build of torch" in warning
    else:
        assert "CUDA_VISIBLE_DEVICES=''" in warning and "client-resources-num-gpus" in warning


def test_a_cuda_build_hidden_by_ray_points_at_the_gpu_setting(
    machine_with_gpus: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    warning = devices.unused_gpus_warning(torch.device("cpu"))
    assert (
        warning is not None
        and "none is visible to this process (CUDA_VISIBLE_DEVICES='')" in warning
    )
    assert '--federation-config "client-resources-num-gpus=0.25"' in warning


def test_no_warning_without_gpus_or_on_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "NVIDIA_GPUS_GLOB", str(tmp_path / "none" / "*"))
    assert devices.unused_gpus_warning(torch.device("cpu")) is None
    assert devices.unused_gpus_warning(torch.device("cuda", 0)) is None


def test_each_source_says_its_device_once_per_run(
    machine_with_gpus: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Client:  # what _announce reads of a SourceClient
        class spec:
            name = "python"

        device = torch.device("cpu")

    context = Context(0, 1, {}, RecordDict(), {})
    with caplog.at_level(logging.INFO, logger=tasks.__name__):
        firsts = [client_app._first_call(context, "python") for _ in range(3)]
        for first in firsts:
            tasks._say_device(Client(), first)  # type: ignore[arg-type]
    assert firsts == [True, False, False]
    said = [r for r in caplog.records if "trains on cpu (" in r.getMessage()]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and len(warned) == 1
    assert "python: training on the CPU although this machine has 8" in warned[0].getMessage()


def test_a_cpu_node_has_no_gpu_memory_to_bound() -> None:
    devices.cap_gpu_memory(torch.device("cpu"), 0.25)

    assert devices.describe(torch.device("cpu")).startswith("cpu (")


@pytest.mark.gpu
def test_a_node_sharing_a_gpu_cannot_allocate_past_its_share() -> None:
    device = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(device).total_memory
    try:
        devices.cap_gpu_memory(device, 0.25)
        assert ", at most 25%: " in devices.describe(device)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(int(total * 0.3), dtype=torch.uint8, device=device)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()
