"""The TTFT predictor learns a worker's prefill line from its own prefills."""

from __future__ import annotations

import random

import pytest

from router.ttft_predictor import TTFTPredictor


def test_a_new_worker_is_assumed_to_run_at_the_prior_rate():
    predictor = TTFTPredictor(prior_tokens_per_s=10_000)
    assert predictor.prefill_s("w", queued_tokens=3000, own_tokens=1000) == pytest.approx(0.4)


def test_the_line_is_learned_and_predicts_sizes_it_never_saw():
    """Fitted on prompts of 100-2000 tokens with noise; checked on 4000 and 50 (held out)."""
    rng = random.Random(7)
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    for _ in range(200):
        tokens = rng.randint(100, 2000)
        seconds = 0.030 + tokens / 2500 + rng.gauss(0, 0.005)  # 30 ms fixed, 2500 tok/s
        predictor.observe_prefill("w", queued_tokens=0, own_tokens=tokens, seconds=seconds)
    assert predictor.prefill_s("w", 3000, 1000) == pytest.approx(0.030 + 4000 / 2500, rel=0.05)
    assert predictor.prefill_s("w", 0, 50) == pytest.approx(0.030 + 50 / 2500, rel=0.25)
    assert predictor.tokens_per_s("w") == pytest.approx(2500, rel=0.05)


def test_a_worker_that_slows_down_is_relearned():
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    for i in range(100):
        predictor.observe_prefill("w", 0, 200 + 10 * (i % 50), (200 + 10 * (i % 50)) / 5000)
    for i in range(100):
        predictor.observe_prefill("w", 0, 200 + 10 * (i % 50), (200 + 10 * (i % 50)) / 1000)
    assert predictor.tokens_per_s("w") == pytest.approx(1000, rel=0.1)


def test_one_size_only_gives_the_mean_rate():
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    for _ in range(20):
        predictor.observe_prefill("w", 0, 500, 0.25)
    assert predictor.prefill_s("w", 500, 500) == pytest.approx(0.5)


def test_the_handoff_time_follows_the_decode_workers_load():
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    assert predictor.handoff_s("d", requests=5) == 0.0  # nothing learned: no guess
    for requests in range(1, 41):
        predictor.observe_handoff("d", requests, 0.01 + 0.005 * requests)
    assert predictor.handoff_s("d", requests=60) == pytest.approx(0.31, rel=0.05)
    # The load drained: the same fit predicts the idle time, not the burst's average.
    assert predictor.handoff_s("d", requests=1) == pytest.approx(0.015, rel=0.1)


def test_a_probed_worker_starts_from_its_probe_then_from_its_own_prefills():
    predictor = TTFTPredictor(prior_tokens_per_s=2000.0, min_samples=4)
    # The probe: 0.05 s fixed + 1 ms per token, i.e. far slower than the prior.
    predictor.seed("p", [(128, 0.178), (1024, 1.074), (128, 0.178), (1024, 1.074)])
    assert predictor.prefill_s("p", 0, 500) == pytest.approx(0.55, rel=1e-6)
    assert predictor.prefill_s("unprobed", 0, 500) == pytest.approx(0.25)
    for tokens in (100, 200, 300, 400):  # its own prefills: 2 ms per token
        predictor.observe_prefill("p", 0, tokens, 0.002 * tokens)
    assert predictor.prefill_s("p", 0, 500) == pytest.approx(1.0, rel=1e-6)
    predictor.seed("p", [])  # a new engine without a probe: back to the prior
    assert predictor.prefill_s("p", 0, 500) == pytest.approx(0.25)
