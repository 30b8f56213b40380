import pytest
import torch

from dept_strategy.outer import OuterOptimizer


def test_fedavg_step_is_the_weighted_mean_of_client_bodies() -> None:
    theta = {"w": torch.tensor([1.0, 2.0])}
    clients = [torch.tensor([0.0, 0.0]), torch.tensor([3.0, 6.0])]
    weights = [3.0, 1.0]
    delta = sum(w * (theta["w"] - c) for w, c in zip(weights, clients, strict=True)) / sum(weights)
    outer = OuterOptimizer(theta, kind="fedavg")
    outer.step({"w": delta})
    expected = (3 * clients[0] + 1 * clients[1]) / 4
    assert torch.allclose(outer.body()["w"], expected)


def test_nesterov_matches_a_hand_computation() -> None:
    lr, mu = 0.7, 0.9
    outer = OuterOptimizer({"w": torch.tensor([1.0])}, kind="nesterov", lr=lr, momentum=mu)
    theta, buf = 1.0, 0.0
    for g in (0.5, -0.2, 0.1):
        outer.step({"w": torch.tensor([g])})
        buf = mu * buf + g if buf else g  # torch starts the buffer with the first gradient
        theta -= lr * (g + mu * buf)
        assert outer.body()["w"].item() == pytest.approx(theta, rel=1e-6)


def test_rejects_unknown_kind_and_bad_lr() -> None:
    with pytest.raises(ValueError, match="adam"):
        OuterOptimizer({"w": torch.zeros(1)}, kind="adam")
    with pytest.raises(ValueError, match="learning rate"):
        OuterOptimizer({"w": torch.zeros(1)}, kind="fedavg", lr=0)
