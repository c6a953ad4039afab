"""The head bound's share of the head's density that a prompt's rest is assumed to have."""

from __future__ import annotations

import random

import pytest

from router.admission.rest_density import PRIOR_SHARE, RestDensity


def observe(density: RestDensity, ratio: float) -> None:
    # a 1000-character head of 250 tokens; a 4000-character rest at `ratio` of its density
    density.observe(head_tokens=250, head_chars=1000, rest_chars=4000,
                    rest_tokens=round(1000 * ratio))  # fmt: skip


def test_the_prior_holds_until_enough_prompts_were_measured():
    density = RestDensity(max_samples=100, min_samples=10)
    for _ in range(9):
        observe(density, 1.0)
    assert density.share() == PRIOR_SHARE
    observe(density, 1.0)
    assert density.share() == pytest.approx(1.0)


def test_the_share_is_a_low_quantile_of_the_latest_ratios_and_never_over_one():
    density = RestDensity(max_samples=200, min_samples=10)
    rng = random.Random(0)
    for _ in range(200):
        observe(density, rng.uniform(0.9, 1.3))
    assert 0.9 <= density.share() <= 0.92  # about the 1st percentile of 0.9-1.3
    for _ in range(200):  # the traffic changes: only the latest 200 count
        observe(density, 1.5)
    assert density.share() == 1.0  # denser rests still count as no denser than the head


def test_a_sparser_rest_lowers_the_share_at_once():
    density = RestDensity(max_samples=100, min_samples=10)
    for _ in range(50):
        observe(density, 1.0)
    observe(density, 0.5)
    observe(density, 0.5)
    assert density.share() == pytest.approx(0.5)


def test_off_and_degenerate_samples_learn_nothing():
    off = RestDensity(max_samples=0)
    for _ in range(100):
        observe(off, 1.0)
    assert off.share() == PRIOR_SHARE and len(off) == 0
    density = RestDensity(max_samples=10, min_samples=1)
    density.observe(head_tokens=0, head_chars=100, rest_chars=100, rest_tokens=10)
    density.observe(head_tokens=10, head_chars=100, rest_chars=0, rest_tokens=10)
    density.observe(head_tokens=10, head_chars=100, rest_chars=100, rest_tokens=-5)
    assert len(density) == 0
