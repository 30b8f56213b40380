"""dept run's CPU share per client: the cores split over the clients, so as many train at
once as the machine holds, each on its own threads, and the GPUs still bound how many."""

from __future__ import annotations

import pytest

from server_app.sizing import ClientShare, client_cpus, client_share


@pytest.mark.parametrize(
    ("clients", "cores", "cpus"), [(4, 2, 1), (1, 2, 2), (3, 2, 1), (4, 16, 4), (5, 16, 3)]
)
def test_each_client_gets_its_share_of_the_cores(clients: int, cores: int, cpus: int) -> None:
    assert client_cpus(clients, cores) == cpus
    share = client_share(clients, 0.0, 0, cores)
    assert share.at_once * share.cpus <= max(cores, cpus), "no more threads than cores"
    assert share.at_once == min(clients, cores // cpus)


def test_the_gpus_bound_how_many_train_at_once() -> None:
    assert client_share(4, 0.25, 1, 16) == ClientShare(gpus=0.25, cpus=4, at_once=4)
    assert client_share(8, 0.5, 2, 16).at_once == 4, "two clients per GPU"
    assert client_share(4, 2.0, 4, 16).at_once == 2, "a two-process source takes two GPUs"


def test_the_launch_line_says_how_many_train_at_once() -> None:
    assert ClientShare(gpus=0.0, cpus=1, at_once=2).describe() == (
        "2 training at a time, each with 0 GPU and 1 CPU thread"
    )
    assert ClientShare(gpus=0.25, cpus=4, at_once=4).describe() == (
        "4 training at a time, each with 0.25 GPU and 4 CPU threads"
    )
