"""Which of a round's updates point unlike the others: the check an update of honest size
but the wrong direction (reversed, sign-flipped, colluding) cannot pass by its size.

For every accepted update a, its cosine with the weighted mean of the round's other
updates (leave-one-out), over θ, from the round's Gram matrix
(:func:`dept_strategy.diagnostics.gram`, one read of the spool shared with the
diagnostics): with D the (n, n) dot products, w the token weights times each update's
scale,

    cos_a = Σ_{b≠a} w_b D[a, b] / (√D[a, a] · √(Σ_{b,c≠a} w_b w_c D[b, c]))

An update is flagged when its cosine is more than ``factor`` robust deviations (1.4826 ×
the median absolute deviation, never below :data:`MIN_SPREAD`) from the round's median.

Why relative to the round, not a fixed threshold: honest sources' agreement drifts in
training. In the nine-language runs (``benchmarks/results/diagnostics-glob-nine``) every
source's cosine with the others' mean was +0.06 to +0.23 in round 2 and −0.04 to −0.26 by
round 24, when each source partly undoes the others' last pull on the shared body. A
reversed update sits where its honest cosine's negative would: below the pack early, above
it late. Both are caught where the pack is tight; where honest cosines scatter widely
(a round where sources disagree), nothing is flagged, and a reversed update there also has
the least shared progress to undo.

What that buys depends on how much the sources share. Replaying those two nine-language
runs' Gram matrices with each source's update reversed in turn (factor 4): a reversed update
is flagged in 9-18% of (round, source) cases, and an honest one in 0-3.7% (at factor 3:
13-31% and 0.9-5.6%). Nine scripts share little of the body's direction, so a reversal
there is nearly invisible; sources that share more (one language, related domains) are
both more exposed to it and more protected.

Clipping (``outlier-action`` clip) scales a flagged update by the deviation allowed over
its own, so a borderline honest one loses little and a far one most of its weight.
Needs three updates: with two, each one's cosine with the other is the same number.
"""

from __future__ import annotations

import math

import numpy as np

from dept_strategy.screening import Flagged

# No round is held to a spread below this: honest rounds' own spreads measured 0.012-0.19
# (median 0.06-0.1, nine-language GLOB runs), and three updates give a MAD of the closest
# pair only (honest synthetic sources at +0.36, +0.43, +0.44 read as 3.6 deviations of 0.02)
MIN_SPREAD = 0.05
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


def screen_directions(
    dots: np.ndarray, weights: np.ndarray, *, factor: float
) -> tuple[np.ndarray, dict[int, Flagged]]:
    """(the leave-one-out cosines, ``{index: Flagged}`` for those unlike the round's);
    nothing flagged with ``factor`` 0 or fewer than :data:`MIN_UPDATES` updates."""
    cosines = leave_one_out_cosines(dots, weights)
    finite = cosines[np.isfinite(cosines)]
    if factor <= 0 or len(finite) < MIN_UPDATES:
        return cosines, {}
    median = float(np.median(finite))
    spread = max(MAD_TO_SIGMA * float(np.median(np.abs(finite - median))), MIN_SPREAD)
    allowed = factor * spread
    flagged = {}
    for index, cosine in enumerate(cosines):
        deviation = abs(cosine - median)
        if np.isfinite(cosine) and deviation > allowed:
            why = (
                f"its cosine with the other updates' mean is {cosine:+.3f}, against the "
                f"round's median {median:+.3f}: {deviation / spread:.1f} deviations of "
                f"{spread:.3f} (config key 'direction-factor' is {factor:g})"
            )
            flagged[index] = Flagged(why, allowed / deviation)
    return cosines, flagged
