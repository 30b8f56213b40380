"""The outer optimizer: the server's step on the body, given the averaged pseudo-gradient.

Δ = Σ w_k (θ_global − θ_k) plays the role of a gradient: ``p.grad = Δ`` then ``step()``.
FedAvg is SGD with lr 1 and no momentum (θ ← Σ w_k θ_k, what the DEPT paper reports);
Nesterov is SGD with Nesterov momentum as in DiLoCo. A ``torch.optim`` optimizer gives both
and a state_dict to checkpoint.
"""

from __future__ import annotations

import torch


class OuterOptimizer:
    """Holds θ (float32, CPU) and applies the outer step to it."""

    def __init__(
        self, body: dict[str, torch.Tensor], *, kind: str, lr: float = 1.0, momentum: float = 0.9
    ) -> None:
        if kind not in ("fedavg", "nesterov"):
            raise ValueError(f"unknown outer optimizer {kind!r}; expected fedavg or nesterov")
        if lr <= 0:
            raise ValueError(f"outer learning rate must be > 0, got {lr}")
        self.kind = kind
        self.params = {
            name: torch.nn.Parameter(
                t.detach().to("cpu", torch.float32).clone(), requires_grad=False
            )
            for name, t in body.items()
        }
        if kind == "fedavg":
            self.optimizer = torch.optim.SGD(self.params.values(), lr=lr)
        else:
            self.optimizer = torch.optim.SGD(
                self.params.values(), lr=lr, momentum=momentum, nesterov=True
            )

    def step(self, delta: dict[str, torch.Tensor]) -> None:
        """θ ← optimizer step with gradient Δ (same keys and shapes as θ)."""
        for name, param in self.params.items():
            param.grad = delta[name].to(param.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def body(self) -> dict[str, torch.Tensor]:
        return {name: p.data for name, p in self.params.items()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(p.shape) for name, p in self.params.items()}
