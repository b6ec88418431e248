"""The two-sample Kolmogorov-Smirnov test, two-sided, with its exact p-value.

The statistic D is the largest gap between the two samples' empirical distribution functions.
Its exact null distribution counts monotone lattice paths: the pooled, sorted samples form a path
from (0, 0) to (n, m), one step right for each value of the first sample and one step up for each
of the second, and D >= d exactly when the path leaves the band |i/n - j/m| < d. Every ordering of
the pooled values is equally likely under the null, so each path's probability is the product of
its steps' chances ((n - i) / (n + m - i - j) to go right). The exits are summed directly, not as
one minus the paths that stay inside, so a tiny p-value keeps its digits.

Numbers only, no scipy: the product does not ship scipy, and tests/gateway/cache checks
this against scipy.stats.ks_2samp(method="exact").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KSResult:
    statistic: float  # D, in [0, 1]
    p_value: float  # P(D >= statistic) under the null that both samples come from one distribution


def ks_2samp(first: Sequence[float], second: Sequence[float]) -> KSResult:
    """Two-sided two-sample KS test with the exact p-value (ties: D as the empirical distribution
    functions give it, p-value as if there were none, as scipy's exact method does)."""
    n, m = len(first), len(second)
    if n == 0 or m == 0:
        raise ValueError("the KS test needs at least one value in each sample")
    a, b = np.sort(np.asarray(first, dtype=float)), np.sort(np.asarray(second, dtype=float))
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("the KS test takes finite values only")
    pooled = np.concatenate([a, b])
    # D in units of 1/(n m): an integer, so the band's edge is compared exactly.
    below_a = np.searchsorted(a, pooled, side="right").astype(np.int64)
    below_b = np.searchsorted(b, pooled, side="right").astype(np.int64)
    gap = int(np.max(np.abs(below_a * m - below_b * n)))
    return KSResult(statistic=gap / (n * m), p_value=_p_at_least(gap, n, m))


def _p_at_least(gap: int, n: int, m: int) -> float:
    """P(max |i m - j n| >= gap) over uniformly random paths from (0, 0) to (n, m)."""
    if gap <= 0:
        return 1.0
    total = n + m
    i = np.arange(n + 1, dtype=np.int64)
    mass = np.zeros(n + 1)  # mass[i]: paths at (i, s - i) that stayed inside, on the current diagonal s
    mass[0] = 1.0
    exited = 0.0
    for s in range(1, total + 1):
        j = s - i
        valid = (j >= 0) & (j <= m)
        left = total - s + 1  # values not yet placed before this step
        right = np.zeros(n + 1)
        right[1:] = mass[:-1] * (n - i[1:] + 1) / left  # from (i - 1, j): a value of the first sample
        up = mass * np.clip(m - j + 1, 0, None) / left  # from (i, j - 1): a value of the second sample
        arrived = np.where(valid, right + up, 0.0)
        outside = np.abs(i * m - j * n) >= gap
        exited += float(arrived[outside].sum())
        mass = np.where(outside, 0.0, arrived)
    return min(1.0, max(0.0, exited))
