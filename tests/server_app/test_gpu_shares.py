"""dept run's GPU share per client is one Ray can place: every client runs at once."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dept.config import load_config
from server_app.launch import main as dept_run
from server_app.sizing import gpu_share, visible_gpus
from tests.helpers import debug_run_config

RAY_UNIT = 10_000  # Ray counts GPU fractions in steps of 1e-4


def clients_ray_places(share: float, gpus: int) -> int:
    """How many actors asking ``share`` of a GPU Ray runs at once on ``gpus`` GPUs: a
    fractional request sits on one GPU, never split across two; a whole one takes whole GPUs."""
    units = round(share * RAY_UNIT)
    if share >= 1:
        return gpus // math.ceil(share)
    return gpus * (RAY_UNIT // units)


@pytest.mark.parametrize("gpus", [1, 2, 3, 8])
@pytest.mark.parametrize("clients", range(1, 17))
def test_every_client_gets_a_share_ray_places(gpus: int, clients: int) -> None:
    share = gpu_share(clients, gpus)
    assert 0 < share <= 1
    assert clients_ray_places(share, gpus) >= clients
    # and no smaller than it must be: one more client per GPU would not fit
    assert share >= 1 / math.ceil(clients / gpus) - 1 / RAY_UNIT


def test_the_share_that_left_a_client_unscheduled_now_places() -> None:
    assert clients_ray_places(0.6666, 2) == 2  # the old g/n share: 3 clients, 2 fit
    assert gpu_share(3, 2) == 0.5


def test_no_gpus_no_share(tmp_path: Path) -> None:
    assert gpu_share(4, 0) == 0.0
    assert visible_gpus(load_config(debug_run_config(tmp_path, device="cpu"))) == 0


def test_a_simulation_cannot_pick_one_gpu_by_number(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = debug_run_config(tmp_path, device="cuda:1")
    assert dept_run(["-c", f"device='cuda:1' output-dir='{config['output-dir']}'"]) == 2
    err = capsys.readouterr().err
    assert "config key 'device' is 'cuda:1', but in a simulation Ray gives each client" in err
