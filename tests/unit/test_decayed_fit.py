"""Decayed least squares: slopes that can be trusted, or left out."""

from __future__ import annotations

import random

import pytest

from router.admission.decayed_fit import DecayedFit


def test_two_features_are_recovered_from_noisy_samples():
    rng = random.Random(1)
    fit = DecayedFit(2)
    for _ in range(400):
        a, b = rng.uniform(0, 10), rng.uniform(0, 1000)
        fit.add((a, b), 1.0 + 0.5 * a + 0.01 * b + rng.gauss(0, 0.05), 0.999)
    intercept, (slope_a, slope_b) = fit.solve(8)
    assert intercept == pytest.approx(1.0, abs=0.05)
    assert slope_a == pytest.approx(0.5, rel=0.03)
    assert slope_b == pytest.approx(0.01, rel=0.03)


def test_a_feature_whose_slope_comes_out_negative_is_left_out():
    """Time that seems to fall as a feature grows is noise: that feature is dropped and
    the line refitted on the other, never a promise of work for free."""
    fit = DecayedFit(2)
    for i in range(50):
        a, b = i % 10, (i * 37) % 100
        fit.add((a, b), 2.0 + 0.3 * a - 0.001 * b, 1.0)
    intercept, (slope_a, slope_b) = fit.solve(8)
    assert slope_b == 0.0
    assert slope_a == pytest.approx(0.3, rel=0.05)
    assert intercept > 0


def test_features_that_move_together_keep_the_one_that_explains_more():
    fit = DecayedFit(2)
    for i in range(1, 30):
        fit.add((float(i), 2.0 * i), 0.1 + 0.2 * i, 1.0)  # the split is not identifiable
    intercept, slopes = fit.solve(8)
    predicted = intercept + slopes[0] * 40 + slopes[1] * 80
    assert predicted == pytest.approx(0.1 + 0.2 * 40, rel=1e-6)
    assert 0.0 in slopes


def test_nothing_varies_gives_the_mean_rate_over_the_first_feature():
    fit = DecayedFit(2)
    for _ in range(10):
        fit.add((4.0, 100.0), 0.8, 1.0)
    intercept, (rate, other) = fit.solve(8)
    assert (intercept, other) == (0.0, 0.0)
    assert rate == pytest.approx(0.2)
    assert DecayedFit(1).solve(0) is None  # no samples, x_0 is 0: nothing known
    assert fit.solve(11) is None  # too few samples
