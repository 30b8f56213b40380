"""The outer optimizer: the server's step on the shared parameters, given the averaged update.

Δ = Σ w_k (θ_global − θ_k) plays the role of a gradient: ``p.grad = Δ`` then ``step()``.
Which optimizers exist, and their settings, is :mod:`dept.model.outer_optimizers`; a ``torch.optim``
optimizer gives each a state_dict to checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from dept.model.outer_optimizers import OUTER_OPTIMIZERS


class OuterOptimizer:
    """Holds the shared tensors (θ, and φ for GLOB/TRIM; float32, CPU) and steps them."""

    def __init__(
        self, params: dict[str, torch.Tensor], *, kind: str, lr: float = 1.0, momentum: float = 0.9
    ) -> None:
        if kind not in OUTER_OPTIMIZERS:
            raise ValueError(
                f"unknown outer optimizer {kind!r}; expected one of {', '.join(OUTER_OPTIMIZERS)}"
            )
        if lr <= 0:
            raise ValueError(f"outer learning rate must be > 0, got {lr}")
        self.kind = kind
        self.params = {
            name: torch.nn.Parameter(
                t.detach().to("cpu", torch.float32).clone(), requires_grad=False
            )
            for name, t in params.items()
        }
        rule = OUTER_OPTIMIZERS[kind]
        optimizer_class = getattr(torch.optim, rule.torch_class)
        self.optimizer: torch.optim.Optimizer = optimizer_class(
            list(self.params.values()), **rule.settings(lr, momentum)
        )

    def step(
        self, delta: dict[str, torch.Tensor], frozen_rows: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Step with gradient Δ; rows masked in ``frozen_rows`` stay put.

        ``delta`` holds every tensor, or (partial synchronisation) those of the fragments
        synced this round: the others get no gradient, so torch's optimizers leave them and
        their state (momentum, Adam's moments and step) untouched, and each fragment has its
        own outer optimizer in effect. A row of φ that no sampled client held has no update;
        momentum or Adam would still move it, so its value is put back after the step. Its
        momentum (or Adam moments) still decay as for a zero update, and Adam's step count is
        per tensor, not per row.
        """
        kept = {
            name: self.params[name].data[mask].clone() for name, mask in (frozen_rows or {}).items()
        }
        for name, value in delta.items():
            self.params[name].grad = value.to(torch.float32)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for name, values in kept.items():
            self.params[name].data[frozen_rows[name]] = values  # type: ignore[index]

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors, JSON-ready rest) of the shared tensors and the optimizer's state, so a
        checkpoint needs no pickle: tensors go to safetensors, the rest to JSON."""
        tensors = {f"shared/{n}": p.data for n, p in self.params.items()}
        state = self.optimizer.state_dict()
        scalars: dict[str, dict[str, Any]] = {}
        for index, values in state["state"].items():
            for key, value in values.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"outer/{index}/{key}"] = value
                else:
                    scalars.setdefault(str(index), {})[key] = value
        return tensors, {"kind": self.kind, "state": scalars, "groups": state["param_groups"]}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        if meta["kind"] != self.kind:
            raise ValueError(
                f"the checkpoint's outer optimizer is {meta['kind']!r}, not {self.kind!r}"
            )
        for name, param in self.params.items():
            saved = tensors[f"shared/{name}"]
            if saved.shape != param.shape:
                raise ValueError(
                    f"checkpoint tensor {name}: shape {tuple(saved.shape)} != {tuple(param.shape)}"
                )
            param.data.copy_(saved)
        state: dict[int, dict[str, Any]] = {}
        for key, value in tensors.items():
            if key.startswith("outer/"):
                _, index, name = key.split("/", 2)
                state.setdefault(int(index), {})[name] = value.clone()
        for index, values in meta["state"].items():
            state.setdefault(int(index), {}).update(values)
        groups = [
            {k: tuple(v) if k == "betas" else v for k, v in group.items()}
            for group in meta["groups"]
        ]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: p.data for name, p in self.params.items()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(p.shape) for name, p in self.params.items()}
