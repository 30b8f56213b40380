"""gpu_check: every step runs (on the CPU here), a failing, hanging or late step is recorded
and the others go on, and the JSON holds what a reader of a GPU run needs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import check as gpu_check
from benchmarks.gpu.check import NO_GPU, Budget, Step, main, read_run, run_step, table_rows

TRAINING_KEYS = {"tokens_per_s", "mfu", "achieved_tflops", "peak_tflops", "attention", "params"}


def _step(code: str, cap_s: float = 30.0) -> Step:
    return Step("probe", cap_s, 2.0, [sys.executable, "-c", code], lambda _: {"figure": 1})


def test_a_failing_step_is_recorded_with_its_last_line(tmp_path: Path) -> None:
    row = run_step(
        _step("print('working'); raise SystemExit('out of memory')"), Budget(60), tmp_path
    )

    assert row["status"] == "failed" and row["error"] == "out of memory"
    assert "figure" not in row


def test_a_step_past_its_cap_is_stopped_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_check, "MIN_CAP_S", 1.0)  # the shortest cap the check would run
    row = run_step(_step("import time; time.sleep(60)", cap_s=2), Budget(60), tmp_path)

    assert row["status"] == "timed out" and row["seconds"] < 10
    assert row["error"].startswith("no result within 2 s")


def test_a_step_the_budget_cannot_hold_is_skipped(tmp_path: Path) -> None:
    row = run_step(_step("print('never')"), Budget(10), tmp_path)

    assert row["status"].startswith("skipped: ") and row["seconds"] == 0.0
    assert not list(tmp_path.iterdir()), "nothing ran"


def test_a_step_that_ends_well_gives_its_figures(tmp_path: Path) -> None:
    row = run_step(_step("pass"), Budget(60), tmp_path)

    assert row["status"] == "ok" and row["error"] is None and row["figure"] == 1


def test_orchestration_share_is_the_round_less_its_slowest_client(tmp_path: Path) -> None:
    def line(server_round: int, wall_s: float, train_s: list[float | None]) -> str:
        bpb = 1.0 if server_round != 1 else None  # evaluated before training and at the end
        sources = {f"s{i}": {"train_s": t, "val_bpb": bpb} for i, t in enumerate(train_s)}
        return json.dumps({"round": server_round, "wall_s": wall_s, "sources": sources})

    lines = [line(0, 5.0, [None, None]), line(1, 25.0, [12.0, 15.0]), line(2, 35.0, [8.0, 9.0])]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    (tmp_path / "run.log").write_text(
        "\x1b[92mINFO \x1b[0m:      s0: trains on cuda:0 (NVIDIA H200, 139.8 GiB)\n"
        "INFO [rank 0/2] dept.train.local: round 1 s0: step 1/4\n"
    )
    log = tmp_path / "dept-run.log"
    log.write_text(
        "05:34:11 dept run: 2 SuperNode processes (no Ray); SuperLink on 127.0.0.1:1\n"
        "  node 0 (s0): GPU 0 (shared by 2, at most 50% of its memory)\n"
        "  node 1 (s1): GPU 0 (shared by 2, at most 50% of its memory)\n"
    )

    result = read_run(tmp_path, log)

    first, second = result["rounds"]
    assert first["round_s"] == 20.0 and first["orchestration_share"] == pytest.approx(0.25)
    assert second["round_s"] == 10.0 and second["orchestration_share"] == pytest.approx(0.1)
    assert second["sum_training_s"] == 17.0 and second["clients"] == 2
    assert [first["evaluated"], second["evaluated"]] == [0, 2]
    assert result["client_devices"] == ["cuda:0 (NVIDIA H200, 139.8 GiB)"]
    assert result["node_placements"]["s1"] == "GPU 0 (shared by 2, at most 50% of its memory)"
    assert result["processes"] == 2
    (row,) = table_rows([{"step": "f", "status": "ok", "seconds": 1.0, **result}])
    assert row[-2:] == (20.0, "25.0%"), "the table shows the round that only trained"


def _check(tmp_path: Path, extra: list[str]) -> dict:
    out = tmp_path / "gpu_check.json"
    assert main(["--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


@pytest.mark.slow  # two dept run federations of processes
def test_cpu_version_runs_every_step_and_says_no_gpu_without_ray_or_flowers_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the device image: no Ray (an import of it fails), no flwr entry points on PATH
    no_ray = tmp_path / "no-ray" / "ray"
    no_ray.mkdir(parents=True)
    (no_ray / "__init__.py").write_text("raise ImportError('no Ray on this machine image')\n")
    monkeypatch.setenv("PYTHONPATH", str(no_ray.parent))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")

    result = _check(tmp_path, [])

    assert capsys.readouterr().out.splitlines()[0] == NO_GPU
    assert result["gpu_used"] is False and result["plan"] == "cpu"
    assert result["environment"]["gpus"] == [] and result["environment"]["torch"]
    steps = {s["step"]: s for s in result["steps"]}
    assert list(steps) == [
        "training debug eager",
        "federation 4 sources",
        "source on 2 processes",
        "training debug compiled",
    ]
    assert all(s["status"] == "ok" for s in steps.values()), steps
    for name in ("training debug eager", "training debug compiled"):
        assert steps[name].keys() >= TRAINING_KEYS and steps[name]["tokens_per_s"] > 0
        assert steps[name]["mfu"] is None, "no peak known for a CPU"
    federation = steps["federation 4 sources"]
    assert [r["clients"] for r in federation["rounds"]] == [4, 4]
    assert all(0 < r["orchestration_share"] < 1 for r in federation["rounds"])
    assert [r["evaluated"] for r in federation["rounds"]] == [0, 4]
    assert [d.split()[0] for d in federation["client_devices"]] == ["cpu"]
    assert steps["source on 2 processes"]["processes"] == 2
    assert result["total_s"] < 450


@pytest.mark.gpu
def test_gpu_short_form(tmp_path: Path) -> None:
    result = _check(tmp_path, ["--quick"])

    assert result["gpu_used"] is True and result["environment"]["cuda"]
    steps = {s["step"]: s for s in result["steps"]}
    multi = steps.pop("source on 2 processes")
    gpus = len(result["environment"]["gpus"])
    assert multi["status"] == ("ok" if gpus >= 2 else f"skipped: {gpus} GPU")
    assert all(s["status"] == "ok" for s in steps.values()), steps
    assert steps["training tiny eager"]["attention"] == "flash"
    assert all(d.startswith("cuda") for d in steps["federation 4 sources"]["client_devices"])
