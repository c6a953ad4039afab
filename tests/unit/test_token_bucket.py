"""Token bucket arithmetic on a fake clock."""

from __future__ import annotations

import pytest

from router.admission.token_bucket import BucketLevel, BucketRate, take

RATE = BucketRate(per_minute=60)  # capacity 60, one token a second


def test_a_new_bucket_is_full_and_a_refusal_takes_nothing():
    level, wait_s = take(None, 60, RATE, now_s=100.0)
    assert (level.tokens, wait_s) == (0.0, 0.0)
    after, wait_s = take(level, 5, RATE, now_s=100.0)
    assert wait_s == pytest.approx(5.0) and after.tokens == 0.0


def test_refill_is_linear_and_capped_at_capacity():
    empty = BucketLevel(0.0, at_s=0.0)
    level, wait_s = take(empty, 10, RATE, now_s=10.0)
    assert wait_s == 0.0 and level.tokens == pytest.approx(0.0)
    level, _ = take(empty, 0, RATE, now_s=10_000.0)
    assert level.tokens == 60.0


def test_a_cost_over_capacity_waits_for_a_full_bucket_instead_of_forever():
    level, wait_s = take(BucketLevel(30.0, 0.0), 500, RATE, now_s=0.0)
    assert wait_s == pytest.approx(30.0) and level.tokens == 30.0
    _, wait_s = take(level, 500, RATE, now_s=30.0)
    assert wait_s == 0.0


def test_a_clock_step_back_refills_nothing():
    level, wait_s = take(BucketLevel(0.0, at_s=50.0), 1, RATE, now_s=40.0)
    assert wait_s == pytest.approx(1.0) and level.tokens == 0.0
