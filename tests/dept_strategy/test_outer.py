import json
import math

import pytest
import torch

from dept.model.outer_optimizers import FEDADAM_BETA2, FEDADAM_EPS
from dept_strategy.outer import OuterOptimizer


def test_fedavg_step_is_the_weighted_mean_of_client_bodies() -> None:
    theta = {"w": torch.tensor([1.0, 2.0])}
    clients = [torch.tensor([0.0, 0.0]), torch.tensor([3.0, 6.0])]
    weights = [3.0, 1.0]
    delta = sum(w * (theta["w"] - c) for w, c in zip(weights, clients, strict=True)) / sum(weights)
    outer = OuterOptimizer(theta, kind="fedavg")
    outer.step({"w": delta})
    expected = (3 * clients[0] + 1 * clients[1]) / 4
    assert torch.allclose(outer.tensors()["w"], expected)


def test_nesterov_matches_a_hand_computation() -> None:
    lr, mu = 0.7, 0.9
    outer = OuterOptimizer({"w": torch.tensor([1.0])}, kind="nesterov", lr=lr, momentum=mu)
    theta, buf = 1.0, 0.0
    for g in (0.5, -0.2, 0.1):
        outer.step({"w": torch.tensor([g])})
        buf = mu * buf + g if buf else g  # torch starts the buffer with the first gradient
        theta -= lr * (g + mu * buf)
        assert outer.tensors()["w"].item() == pytest.approx(theta, rel=1e-6)


def test_rejects_unknown_kind_and_bad_lr() -> None:
    with pytest.raises(ValueError, match="adam"):
        OuterOptimizer({"w": torch.zeros(1)}, kind="adam")
    with pytest.raises(ValueError, match="learning rate"):
        OuterOptimizer({"w": torch.zeros(1)}, kind="fedavg", lr=0)


def test_fedadam_matches_a_hand_computation() -> None:
    lr, b1, b2, eps = 0.1, 0.9, FEDADAM_BETA2, FEDADAM_EPS
    outer = OuterOptimizer({"w": torch.tensor([1.0])}, kind="fedadam", lr=lr, momentum=b1)
    theta, m, v = 1.0, 0.0, 0.0
    for t, g in enumerate((0.5, -0.2, 0.1), start=1):
        outer.step({"w": torch.tensor([g])})
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        theta -= lr * (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)
        assert outer.tensors()["w"].item() == pytest.approx(theta, rel=1e-5)


@pytest.mark.parametrize("kind", ["nesterov", "fedadam"])
def test_frozen_rows_do_not_move_even_with_momentum(kind: str) -> None:
    outer = OuterOptimizer({"phi": torch.ones(3, 2)}, kind=kind, lr=0.5)
    frozen = torch.tensor([False, True, False])
    outer.step({"phi": torch.ones(3, 2)})  # builds momentum on every row
    outer.step({"phi": torch.zeros(3, 2)}, {"phi": frozen})
    phi = outer.tensors()["phi"]
    assert torch.equal(phi[1], phi.new_full((2,), phi[1, 0].item()))
    before = phi.clone()
    outer.step({"phi": torch.zeros(3, 2)}, {"phi": frozen})
    assert torch.equal(outer.tensors()["phi"][1], before[1])
    assert not torch.equal(outer.tensors()["phi"][0], before[0]), "momentum still moves row 0"


@pytest.mark.parametrize("kind", ["fedavg", "nesterov", "fedadam"])
def test_state_round_trips_without_pickle(kind: str) -> None:
    outer = OuterOptimizer({"w": torch.ones(3), "v": torch.zeros(2, 2)}, kind=kind, lr=0.1)
    for g in (0.5, -0.2):
        outer.step({"w": torch.full((3,), g), "v": torch.full((2, 2), g)})
    tensors, meta = outer.state_dict()
    meta = json.loads(json.dumps(meta))  # it must survive JSON
    restored = OuterOptimizer({"w": torch.zeros(3), "v": torch.ones(2, 2)}, kind=kind, lr=0.1)
    restored.load_state_dict({k: v.clone() for k, v in tensors.items()}, meta)
    for stepped in (outer, restored):
        stepped.step({"w": torch.full((3,), 0.3), "v": torch.full((2, 2), 0.3)})
    for name in ("w", "v"):
        assert torch.equal(outer.tensors()[name], restored.tensors()[name])
    with pytest.raises(ValueError, match="outer optimizer"):
        OuterOptimizer({"w": torch.zeros(3), "v": torch.ones(2, 2)}, kind="fedavg").load_state_dict(
            tensors, {**meta, "kind": "other"}
        )
