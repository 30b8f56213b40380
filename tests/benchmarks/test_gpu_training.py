"""gpu_training runs on a CPU too, and says that no GPU was used."""

import contextlib
import json
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.gpu import training as gpu_training
from benchmarks.gpu.training import compiled, flops_per_token, main, peak_of
from dept.model.build import build_model

CPU_DEBUG = ["--device", "cpu", "--model", "debug", "--batch-size", "2", "--seq-len", "32"]


def test_runs_on_cpu_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"

    assert main([*CPU_DEBUG, "--steps", "2", "--warmup", "1", "--out", str(out)]) == 0

    assert "NO GPU USED" in capsys.readouterr().out
    result = json.loads((out / "gpu_training.json").read_text())
    assert result["gpu_used"] is False and result["mfu"] is None
    assert result["tokens_per_s"] > 0 and result["tokens"] == 2 * 2 * 32


def test_mfu_against_a_given_peak(tmp_path: Path) -> None:
    out = tmp_path / "out"

    main([*CPU_DEBUG, "--steps", "1", "--warmup", "0", "--peak-tflops", "1", "--out", str(out)])

    result = json.loads((out / "gpu_training.json").read_text())
    assert result["mfu"] == result["achieved_tflops"]
    assert flops_per_token(10, "debug", 32) == 60 + 12 * 2 * 64 * 32


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),  # SXM
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None),  # a slice: a fraction of the peak
        ("NVIDIA H1000", None),
        ("Tesla T4", None),
    ],
)
def test_the_peak_is_the_most_specific_match_of_the_name(name: str, peak: float | None) -> None:
    assert peak_of(name) == peak


def _no_flash_kernel(device: torch.device, flash: bool = True) -> contextlib.AbstractContextManager:
    """As flash-only SDPA where a compiled model passes a mask: no kernel runs (on the CPU,
    memory-efficient attention has none)."""
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]) if flash else contextlib.nullcontext()


@pytest.fixture
def quick_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile traces as ever but runs eager: inductor takes 40 s for this on a CPU."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, backend="": real(model, backend="eager"))
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.usefixtures("quick_compile")
def test_compile_keeps_flash_only_where_it_runs(caplog: pytest.LogCaptureFixture) -> None:
    model = build_model("debug", 64, 16)

    _, flash = compiled(model, torch.device("cpu"), torch.randint(64, (2, 16)))

    assert flash is True
    assert not [r for r in caplog.records if r.name == gpu_training.log.name]


@pytest.mark.slow
@pytest.mark.usefixtures("quick_compile")
def test_compile_falls_back_to_default_attention_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gpu_training, "attention_kernel", _no_flash_kernel)
    out = tmp_path / "out"

    assert main([*CPU_DEBUG, "--compile", "--steps", "1", "--warmup", "1", "--out", str(out)]) == 0

    result = json.loads((out / "gpu_training.json").read_text())
    assert result["attention"] == "sdpa-default" and result["tokens_per_s"] > 0
    warning = next(r for r in caplog.records if r.name == gpu_training.log.name).getMessage()
    assert warning.startswith(
        f"flash-only SDPA fails under torch.compile with torch {torch.__version__}"
    )
    assert "No viable backend for scaled_dot_product_attention" in warning, "the kernel's error"


@pytest.mark.gpu
@pytest.mark.parametrize("compile_model", [False, True])
def test_cuda_bf16_flash(tmp_path: Path, compile_model: bool) -> None:
    out = tmp_path / "out"
    args = ["--model", "tiny", "--steps", "3", "--warmup", "2", "--out", str(out)]

    main([*args, *(["--compile"] if compile_model else [])])

    result = json.loads((out / "gpu_training.json").read_text())
    assert result["gpu_used"] is True and result["tokens_per_s"] > 0
    assert compile_model or result["attention"] == "flash", "eager always runs flash"
