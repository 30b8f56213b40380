"""The outer optimizers as data: the server's step on the shared tensors, given Δ as gradient.

Each is a ``torch.optim`` optimizer with fixed settings (named, not imported here, so the
config and ``--help`` stay free of torch), a cap on ``outer-lr`` beyond which the step
wrecks the body instead of training it, and how many float32 copies of the shared tensors
its state holds (for the memory check). :mod:`dept_strategy.outer` builds and steps them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

OuterName = Literal["fedavg", "nesterov", "fedadam"]
FEDADAM_BETA2 = 0.99  # Reddi et al.; with an ε of 1e-3 the step stays bounded where Δ is tiny
FEDADAM_EPS = 1e-3


@dataclass(frozen=True)
class OuterRule:
    name: str
    torch_class: str  # in torch.optim
    settings: Callable[[float, float], dict[str, Any]]  # (outer-lr, outer-momentum) -> kwargs
    uses_momentum: bool  # outer-momentum must then be > 0
    lr_cap: float
    why_cap: str
    state_copies: int  # float32 copies of the shared tensors: the gradient, + its moments
    summary: str  # one line for the config key's doc


OUTER_OPTIMIZERS: dict[str, OuterRule] = {
    r.name: r
    for r in (
        OuterRule(
            "fedavg",
            "SGD",
            lambda lr, momentum: {"lr": lr},
            False,
            2.0,
            "a step past twice the clients' mean update moves the body away from all of them",
            1,
            "SGD; lr 1 is the mean of the clients' models",
        ),
        OuterRule(
            "nesterov",
            "SGD",
            lambda lr, momentum: {"lr": lr, "momentum": momentum, "nesterov": True},
            True,
            2.0,
            "with momentum the step grows further still (DiLoCo uses 0.7)",
            2,
            "SGD with Nesterov momentum; DiLoCo: lr 0.7, momentum 0.9",
        ),
        OuterRule(
            "fedadam",
            "Adam",
            lambda lr, momentum: {
                "lr": lr,
                "betas": (momentum, FEDADAM_BETA2),
                "eps": FEDADAM_EPS,
            },
            True,
            1.0,
            "Adam moves every weight by about outer-lr per round (use 1e-3 to 1e-1)",
            3,
            "Adam: β1 outer-momentum, β2 0.99, ε 1e-3",
        ),
    )
}
