"""Central differential privacy on the shared update: the DP-FedAvg recipe, with ε
accounted by Google's ``dp-accounting``.

Each round, on the server (trusted: it sees every update, as it always does here):

1. each accepted source's update (θ, and glob's φ: everything that becomes shared) is
   clipped to L2 norm ``C`` (``dp-clip-norm``), after the size and direction screening;
2. the clipped updates are summed with one weight each (not tokens: a source's share of
   the sum must not depend on what it claims) and Gaussian noise of standard deviation
   ``σ·C`` (``σ`` = ``dp-noise-multiplier``) is added to every coordinate;
3. the sum is divided by the number of sources *sampled* for the round, fixed before any
   reply comes, so a source that fails or is refused changes no other's weight.

Adding or removing one source's data changes the noiseless sum by at most ``C``: each
round is a Gaussian mechanism of noise multiplier ``σ``, and the rounds compose. The
privacy unit is **a source** (all its text), for everything the server releases: the
body each round and every model exported with it. What it does not cover: a source's own
embeddings (never shared, trained on its data without noise; a model exported with them
is that source's, not a public one), and the evaluation figures sources report.

The accountant is the Rényi DP one (``dp_accounting.rdp.RdpAccountant``) over the rounds
whose update was released, at ``dp-delta``; sampling is not counted as amplification (the
strategy samples a fixed number of sources, not Poisson), so ε is an upper bound for any
``fraction-train``.

The noise comes from a generator seeded by the operating system's entropy: a seed in the
config or the checkpoint would let anyone who reads it subtract the noise. A resumed run
therefore does not repeat a round's noise.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import dp_accounting
import torch
from dp_accounting.rdp import RdpAccountant

from dept.config.checks import check_range

RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512])


@dataclass(frozen=True)
class CentralPrivacy:
    """The mechanism's settings (run config keys in brackets); off with ``noise_multiplier`` 0."""

    noise_multiplier: float = 0.0  # σ (dp-noise-multiplier)
    clip_norm: float = 1.0  # C (dp-clip-norm)
    delta: float = 1e-5  # (dp-delta)

    def __post_init__(self) -> None:
        check_range("dp_noise_multiplier", self.noise_multiplier, where="privacy setting")
        check_range("dp_clip_norm", self.clip_norm, where="privacy setting")
        check_range("dp_delta", self.delta, where="privacy setting")

    @property
    def on(self) -> bool:
        return self.noise_multiplier > 0

    def epsilon(self, rounds: int) -> float:
        """ε after ``rounds`` released updates, at ``delta`` (0 before any)."""
        if rounds <= 0:
            return 0.0
        accountant = RdpAccountant(list(RDP_ORDERS))
        accountant.compose(dp_accounting.GaussianDpEvent(self.noise_multiplier), rounds)
        return float(accountant.get_epsilon(self.delta))

    def clip_factor(self, norm: float) -> float:
        """What an update of L2 norm ``norm`` is multiplied by: ≤ 1, to at most ``clip_norm``."""
        return min(1.0, self.clip_norm / norm) if norm > 0 else 1.0

    def add_noise(self, mean: dict[str, torch.Tensor], sampled: int) -> None:
        """Add to ``mean`` (the clipped sum over ``sampled``), in place, the sum's noise
        over ``sampled``: N(0, (σ·C / sampled)²) per coordinate."""
        std = self.noise_multiplier * self.clip_norm / sampled
        generator = torch.Generator()
        generator.manual_seed(secrets.randbits(63))  # never a stored seed (module docstring)
        for tensor in mean.values():  # one tensor's noise in memory at a time
            tensor.add_(torch.empty_like(tensor).normal_(0.0, std, generator=generator))
