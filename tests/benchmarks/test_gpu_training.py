"""gpu_training runs on a CPU too, and says that no GPU was used."""

import json
from pathlib import Path

import pytest

from benchmarks.gpu_training import flops_per_token, main


def test_runs_on_cpu_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    args = ["--device", "cpu", "--model", "debug", "--batch-size", "2", "--seq-len", "32"]

    assert main([*args, "--steps", "2", "--warmup", "1", "--out", str(out)]) == 0

    assert "NO GPU USED" in capsys.readouterr().out
    result = json.loads((out / "gpu_training.json").read_text())
    assert result["gpu_used"] is False and result["mfu"] is None
    assert result["tokens_per_s"] > 0 and result["tokens"] == 2 * 2 * 32


def test_mfu_against_a_given_peak(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--device", "cpu", "--model", "debug", "--batch-size", "2", "--seq-len", "32"]

    main([*args, "--steps", "1", "--warmup", "0", "--peak-tflops", "1", "--out", str(out)])

    result = json.loads((out / "gpu_training.json").read_text())
    assert result["mfu"] == result["achieved_tflops"]
    assert flops_per_token(10, "debug", 32) == 60 + 12 * 2 * 64 * 32


@pytest.mark.gpu
def test_cuda_bf16_flash(tmp_path: Path) -> None:
    out = tmp_path / "out"

    main(["--model", "tiny", "--steps", "3", "--warmup", "2", "--out", str(out)])

    assert json.loads((out / "gpu_training.json").read_text())["gpu_used"] is True
