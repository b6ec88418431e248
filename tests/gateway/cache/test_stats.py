"""The KS test's exact p-value against scipy's (scipy is the oracle here, never imported by tenantgate)."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.cache import ks_2samp

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize(("n", "m", "shift"), [
    (1, 1, 0.0), (3, 1, 1.0), (5, 7, 0.0), (20, 20, 0.0), (20, 20, 0.5), (20, 20, 5.0), (33, 17, 0.3),
    (100, 80, 0.1), (150, 150, 0.4), (7, 200, 0.8),
])
def test_statistic_and_exact_p_value_match_scipy(n: int, m: int, shift: float) -> None:
    rng = np.random.default_rng(n * 1000 + m)
    first, second = rng.normal(size=n), rng.normal(size=m) + shift
    ours, theirs = ks_2samp(first, second), scipy_stats.ks_2samp(first, second, method="exact")
    assert ours.statistic == pytest.approx(theirs.statistic, abs=1e-12)
    assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9, abs=1e-15)


def test_ties_give_scipys_statistic_and_p_value() -> None:
    # TTFTs rounded to the millisecond tie often: D is taken where the distribution functions jump.
    rng = np.random.default_rng(7)
    first, second = np.round(rng.normal(10, 2, 40)), np.round(rng.normal(11, 2, 30))
    ours, theirs = ks_2samp(first, second), scipy_stats.ks_2samp(first, second, method="exact")
    assert ours.statistic == pytest.approx(theirs.statistic)
    assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9)


def test_fully_separated_samples_keep_the_digits_of_a_tiny_p_value() -> None:
    # Summing the exits (not one minus the paths inside) keeps p far below 1e-16.
    result = ks_2samp(np.arange(60.0), np.arange(60.0) + 100)
    assert result.statistic == 1.0
    assert result.p_value == pytest.approx(scipy_stats.ks_2samp(np.arange(60.0), np.arange(60.0) + 100,
                                                                method="exact").pvalue, rel=1e-6)
    assert 0 < result.p_value < 1e-30


def test_identical_samples_are_not_significant() -> None:
    assert ks_2samp([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).p_value == 1.0


@pytest.mark.parametrize(("first", "second"), [([], [1.0]), ([1.0], []), ([float("nan")], [1.0]),
                                               ([1.0], [float("inf")])])
def test_refuses_empty_or_non_finite_samples(first, second) -> None:
    with pytest.raises(ValueError):
        ks_2samp(first, second)
