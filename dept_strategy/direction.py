"""Which of a round's updates point against the others: the check an update of honest size
but the wrong direction (reversed, sign-flipped, colluding) cannot pass by its size.

For every accepted update a and every θ tensor t, the cosine of a's Δ_t with the weighted
mean of the round's other updates' Δ_t (leave-one-out), from the round's per-tensor dot
products (:func:`dept_strategy.diagnostics.gram`, one read of the spool shared with the
diagnostics): with D the (n, n) dot products of one tensor and w the token weights times
each update's scale,

    cos_a = Σ_{b≠a} w_b D[a, b] / (√D[a, a] · √(Σ_{b,c≠a} w_b w_c D[b, c]))

An update's **agreement** is the mean of its cosines over the tensors: each tensor one
vote. Over the whole body at once the cosine says nothing, the large matrices' steps being
dominated by each source's own noise; the small tensors every source moves alike (the norms'
gains above all) are where honest updates agree and a reversed one does not
(docs/privacy.md has the measured figures).

A source's agreement is smoothed over its rounds (each round's past weighs half,
:func:`smoothed`), and an update is flagged when its source's smoothed agreement is negative
*and* more than ``factor`` robust deviations (1.4826 × the median absolute deviation, never
below :data:`MIN_SPREAD`) below the round's median. Smoothed, because a heterogeneous
source is now and then against the others for a round while a reversing node is so every
round; one round alone does not tell them apart. Negative and below, because a source
unlike the others (code among natural languages) agrees less but not against them, and
because late in a heterogeneous run every source partly undoes the others' last pull:
there the pack itself is negative and only an update far below it is flagged.

Scaling cannot turn an update round, so clipping (``outlier-action`` clip) takes a flagged
update's weight from 1 at the threshold down to 0 at twice the threshold: a borderline
one keeps most of its pull, a clear one none (its tokens are still credited; ``reject``
drops it). Needs three updates: with two, each one's cosine with the other is the same
number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from dept_strategy.screening import Flagged

# No round is held to a spread below this: three updates give a MAD of their closest pair
# only, and honest agreements of one round spread over 0.01-0.1
MIN_SPREAD = 0.02
MAD_TO_SIGMA = 1.4826  # the MAD of a normal sample is 0.6745 of its standard deviation
MIN_UPDATES = 3


def leave_one_out_cosines(dots: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(n,) each update's cosine with the ``weights``-weighted mean of the others; NaN for
    a zero update or where the others' mean is zero."""
    n = len(weights)
    out = np.full(n, math.nan)
    for a in range(n):
        others = np.arange(n) != a
        w = weights[others]
        dot = float(w @ dots[a, others])
        others_sq = float(w @ dots[np.ix_(others, others)] @ w)
        scale = math.sqrt(max(dots[a, a], 0.0) * max(others_sq, 0.0))
        if scale > 0:
            out[a] = dot / scale
    return out


def agreements(by_tensor: Iterable[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """(n,) each update's leave-one-out cosine averaged over the tensors (NaN where no
    tensor gives one)."""
    cosines = np.array([leave_one_out_cosines(dots, weights) for dots in by_tensor])
    if cosines.size == 0:
        return np.full(len(weights), math.nan)
    finite = np.isfinite(cosines)
    counts = finite.sum(axis=0)
    sums = np.where(finite, cosines, 0.0).sum(axis=0)
    return np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)


def smoothed(agreement: np.ndarray | float, before: np.ndarray | float) -> np.ndarray:
    """Each update's agreement averaged with its source's smoothed one of the rounds
    before (NaN: none), halving the past's weight every round."""
    return np.where(np.isfinite(before), (np.asarray(before) + agreement) / 2, agreement)


def screen_directions(
    by_tensor: Iterable[np.ndarray],
    weights: np.ndarray,
    *,
    factor: float,
    before: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[int, Flagged]]:
    """(the agreements, ``{index: Flagged}`` for those whose source points against the
    round's); ``before``: each source's smoothed agreement of its earlier rounds (NaN where
    it has none). Nothing flagged with ``factor`` 0 or fewer than :data:`MIN_UPDATES`."""
    agreement = agreements(by_tensor, weights)
    judged = agreement if before is None else smoothed(agreement, before)
    finite = judged[np.isfinite(judged)]
    if factor <= 0 or len(finite) < MIN_UPDATES:
        return agreement, {}
    median = float(np.median(finite))
    spread = max(MAD_TO_SIGMA * float(np.median(np.abs(finite - median))), MIN_SPREAD)
    allowed = factor * spread
    flagged = {}
    for index, value in enumerate(judged):
        below = median - value
        if np.isfinite(value) and value < 0 and below > allowed:
            why = (
                f"it points against the other updates: its agreement (cosine with their "
                f"mean, per tensor) is {agreement[index]:+.3f} this round, {value:+.3f} "
                f"smoothed over its rounds, against the round's median {median:+.3f}: "
                f"{below / spread:.1f} deviations of {spread:.3f} below "
                f"(config key 'direction-factor' is {factor:g})"
            )
            flagged[index] = Flagged(why, min(1.0, max(0.0, 2.0 - below / allowed)))
    return agreement, flagged
