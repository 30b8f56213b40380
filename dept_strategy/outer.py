"""The outer optimizer: the server's step on the shared parameters, given the averaged update.

Δ = Σ w_k (θ_global − θ_k) plays the role of a gradient: ``p.grad = Δ`` then ``step()``.
FedAvg is SGD with lr 1 and no momentum (θ ← Σ w_k θ_k, what the DEPT paper reports);
Nesterov is SGD with Nesterov momentum as in DiLoCo; FedAdam is Adam on Δ (Reddi et al.,
β2 = 0.99 and an ε of 1e-3, which keeps the step bounded where Δ is tiny). A ``torch.optim``
optimizer gives all three and a state_dict to checkpoint.
"""

from __future__ import annotations

import torch

OUTER_KINDS = ("fedavg", "nesterov", "fedadam")
FEDADAM_BETA2 = 0.99
FEDADAM_EPS = 1e-3


class OuterOptimizer:
    """Holds the shared tensors (θ, and φ for GLOB/TRIM; float32, CPU) and steps them."""

    def __init__(
        self, params: dict[str, torch.Tensor], *, kind: str, lr: float = 1.0, momentum: float = 0.9
    ) -> None:
        if kind not in OUTER_KINDS:
            raise ValueError(f"unknown outer optimizer {kind!r}; expected one of {OUTER_KINDS}")
        if lr <= 0:
            raise ValueError(f"outer learning rate must be > 0, got {lr}")
        self.kind = kind
        self.params = {
            name: torch.nn.Parameter(
                t.detach().to("cpu", torch.float32).clone(), requires_grad=False
            )
            for name, t in params.items()
        }
        values = list(self.params.values())
        self.optimizer: torch.optim.Optimizer
        if kind == "fedavg":
            self.optimizer = torch.optim.SGD(values, lr=lr)
        elif kind == "nesterov":
            self.optimizer = torch.optim.SGD(values, lr=lr, momentum=momentum, nesterov=True)
        else:
            self.optimizer = torch.optim.Adam(
                values, lr=lr, betas=(momentum, FEDADAM_BETA2), eps=FEDADAM_EPS
            )

    def step(
        self, delta: dict[str, torch.Tensor], frozen_rows: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Step with gradient Δ (same keys and shapes); rows masked in ``frozen_rows`` stay put.

        A row of φ that no sampled client held has no update; momentum or Adam would still
        move it, so its value is put back after the step.
        """
        kept = {
            name: self.params[name].data[mask].clone() for name, mask in (frozen_rows or {}).items()
        }
        for name, param in self.params.items():
            param.grad = delta[name].to(param.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for name, values in kept.items():
            self.params[name].data[frozen_rows[name]] = values  # type: ignore[index]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: p.data for name, p in self.params.items()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(p.shape) for name, p in self.params.items()}
