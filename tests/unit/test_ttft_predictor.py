"""The TTFT predictor learns a worker's prefill curve from its own prefills."""

from __future__ import annotations

import random

import pytest

from router.admission.ttft_predictor import TTFTPredictor


def observe_alone(predictor: TTFTPredictor, worker: str, tokens: int, seconds: float) -> None:
    """A prefill with nothing else under way on the worker."""
    mark = predictor.prefill_sent(worker, 0.0, queued_tokens=0)
    predictor.observe_prefill(mark, tokens, seconds, queued_after=0)


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
        observe_alone(predictor, "w", tokens, seconds)
    assert predictor.prefill_s("w", 3000, 1000) == pytest.approx(0.030 + 4000 / 2500, rel=0.05)
    assert predictor.prefill_s("w", 0, 50) == pytest.approx(0.030 + 50 / 2500, rel=0.25)
    assert predictor.tokens_per_s("w") == pytest.approx(2500, rel=0.05)


def test_a_prefill_sent_beside_running_requests_is_not_learned_as_alone():
    """A colocated worker (or a prefill worker serving whole requests while the decode
    pool is empty) runs a prompt in steps shared with the others' decodes: that time,
    taken as alone, once made admission refuse prompts as past the SLO on idle workers."""
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    predictor.seed("w", [(n, 0.01 + n / 10_000) for n in (100, 1000, 4000)])
    before_s = predictor.prefill_s("w", 0, 1000)
    for _ in range(50):
        mark = predictor.prefill_sent("w", 0.0, queued_tokens=0, running=3)
        predictor.observe_prefill(mark, 1000, 5.0, queued_after=0)  # 50 times slower
    assert predictor.prefill_s("w", 0, 1000) == pytest.approx(before_s)
    for tokens in (500, 1000, 2000) * 10:  # the same times, alone: learned
        observe_alone(predictor, "w", tokens, 5.0 * tokens / 1000)
    assert predictor.prefill_s("w", 0, 1000) > 10 * before_s


def quadratic_prefill_s(tokens: int) -> float:
    """30 ms fixed, 0.2 ms per token, and attention: 0.02 ms per thousand token pairs."""
    return 0.030 + 0.0002 * tokens + 0.00002 * tokens * tokens / 1000


def test_attentions_square_is_learned_so_a_long_prompt_is_not_forecast_early():
    """Fitted on prompts of 100-2000 tokens; checked on 4000 (held out), where a line
    fitted on the same prompts comes out 15% early."""
    rng = random.Random(11)
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    for _ in range(300):
        tokens = rng.randint(100, 2000)
        observe_alone(predictor, "w", tokens, quadratic_prefill_s(tokens) + rng.gauss(0, 0.003))
    assert predictor.prefill_s("w", 0, 4000) == pytest.approx(quadratic_prefill_s(4000), rel=0.03)


def test_a_probe_of_three_sizes_seeds_the_square_and_two_a_line():
    three, two = (TTFTPredictor(prior_tokens_per_s=1e6) for _ in range(2))
    three.seed("p", [(n, quadratic_prefill_s(n)) for n in (160, 1300, 4000)])
    two.seed("p", [(n, quadratic_prefill_s(n)) for n in (160, 1300)])
    assert three.prefill_s("p", 0, 8000) == pytest.approx(quadratic_prefill_s(8000), rel=1e-6)
    line_s = quadratic_prefill_s(160) + (8000 - 160) * (
        (quadratic_prefill_s(1300) - quadratic_prefill_s(160)) / (1300 - 160)
    )
    assert two.prefill_s("p", 0, 8000) == pytest.approx(line_s, rel=1e-6)


def test_a_worker_that_slows_down_is_relearned():
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    for i in range(100):
        observe_alone(predictor, "w", 200 + 10 * (i % 50), (200 + 10 * (i % 50)) / 5000)
    for i in range(100):
        observe_alone(predictor, "w", 200 + 10 * (i % 50), (200 + 10 * (i % 50)) / 1000)
    assert predictor.tokens_per_s("w") == pytest.approx(1000, rel=0.1)


def test_one_size_only_gives_the_mean_rate():
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    for _ in range(20):
        observe_alone(predictor, "w", 500, 0.25)
    assert predictor.prefill_s("w", 500, 500) == pytest.approx(0.5)


def test_the_handoff_time_follows_the_decode_workers_load():
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    assert predictor.handoff_s("d", requests=5, pulled_tokens=100) == 0.0  # nothing seen: no guess
    for requests in range(1, 41):
        predictor.observe_handoff("d", requests, 100, 0.01 + 0.005 * requests)
    assert predictor.handoff_s("d", 60, 100) == pytest.approx(0.31, rel=0.05)
    # The load drained: the same fit predicts the idle time, not the burst's average.
    assert predictor.handoff_s("d", 1, 100) == pytest.approx(0.015, rel=0.1)


def test_the_handoff_time_grows_with_the_kv_pulled():
    """A transfer takes time per token pulled: fitted on load and prompt size together,
    checked on a prompt four times the longest seen and on a load never seen (held out).
    A line over the load alone (the old fit) charges the 8,000-token prompt the average
    transfer and comes out far too low."""
    rng = random.Random(3)
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)

    def truth(requests: int, tokens: int) -> float:
        return 0.02 + 0.004 * requests + 0.0001 * tokens  # 10k tokens/s over the link

    for _ in range(300):
        requests, tokens = rng.randint(1, 20), rng.randint(50, 2000)
        predictor.observe_handoff(
            "d", requests, tokens, truth(requests, tokens) + rng.gauss(0, 0.003)
        )
    assert predictor.handoff_s("d", 2, 8000) == pytest.approx(truth(2, 8000), rel=0.05)
    assert predictor.handoff_s("d", 40, 100) == pytest.approx(truth(40, 100), rel=0.05)
    # Every prompt one size: the split between the terms is unknown, the load's is learned.
    fixed = TTFTPredictor(prior_tokens_per_s=1e6)
    for requests in range(1, 21):
        fixed.observe_handoff("d", requests, 512, truth(requests, 512))
    assert fixed.handoff_s("d", 30, 512) == pytest.approx(truth(30, 512), rel=1e-6)


def test_a_probed_worker_starts_from_its_probe_then_from_its_own_prefills():
    predictor = TTFTPredictor(prior_tokens_per_s=2000.0, min_samples=4)
    # The probe: 0.05 s fixed + 1 ms per token, i.e. far slower than the prior.
    predictor.seed("p", [(128, 0.178), (1024, 1.074), (128, 0.178), (1024, 1.074)])
    assert predictor.prefill_s("p", 0, 500) == pytest.approx(0.55, rel=1e-6)
    assert predictor.prefill_s("unprobed", 0, 500) == pytest.approx(0.25)
    for tokens in (100, 200, 300, 400):  # its own prefills: 2 ms per token
        observe_alone(predictor, "p", tokens, 0.002 * tokens)
    assert predictor.prefill_s("p", 0, 500) == pytest.approx(1.0, rel=1e-6)
    predictor.seed("p", [])  # a new engine without a probe: back to the prior
    assert predictor.prefill_s("p", 0, 500) == pytest.approx(0.25)


def test_a_decode_worker_without_handoffs_of_its_own_borrows_the_pools():
    predictor = TTFTPredictor(prior_tokens_per_s=1e6, min_samples=8)
    predictor.observe_handoff("d0", 4, 1000, 0.4)  # one handoff, on another decode worker
    assert predictor.handoff_s("d1", 4, 1000) == pytest.approx(0.4)
    assert predictor.handoff_s("d1", 8, 1000) == pytest.approx(0.8)  # through the origin
    for requests in range(1, 9):
        predictor.observe_handoff("d1", requests, 1000, 0.2 + 0.01 * requests)
    assert predictor.handoff_s("d1", 4, 1000) == pytest.approx(0.24, rel=1e-6)


def stepped_engine(rng: random.Random, rate: float, floor_s: float, arrivals_per_s: float):
    """A worker that prefills in steps, as vLLM does: each step takes every prompt waiting
    at its start and lasts ``floor_s + tokens / rate``. Yields (send, end, tokens) in the
    order the prefills end. (No token budget per step: keep the load under capacity.)"""
    clock, waiting, step_end = 0.0, [], 0.0
    sends = []
    for _ in range(400):
        clock += rng.expovariate(arrivals_per_s)
        sends.append((clock, rng.choice((128, 128, 128, 1152))))
    i = 0
    while i < len(sends) or waiting:
        while i < len(sends) and (sends[i][0] <= step_end or not waiting):
            waiting.append(sends[i])
            i += 1
        start = max(step_end, waiting[0][0])
        batch = [w for w in waiting if w[0] <= start]
        waiting = [w for w in waiting if w[0] > start]
        step_end = start + floor_s + sum(t for _, t in batch) / rate
        yield from ((sent, step_end, tokens) for sent, tokens in batch)


def test_a_stepped_engines_queue_drain_is_learned_from_its_busy_time():
    """Fitted on (queue at the send + own tokens, seconds), a stepped engine looks faster
    than it is (1.4x here; in the admission benchmark's sims the old fit swung from 0.7x
    to 20x): a request's wait follows the step it joins, not the queue it saw. Tokens
    over busy seconds give its rate under load (its step floor included)."""
    rate, floor_s = 1350.0, 0.12
    predictor = TTFTPredictor(prior_tokens_per_s=1e6, decay=0.995)
    old_fit = TTFTPredictor(prior_tokens_per_s=1e6, decay=0.995)  # the fit this replaced
    # 2.5/s of prompts averaging 384 tokens: 70% of the rate, in steps of a few prompts.
    prefills = list(stepped_engine(random.Random(3), rate, floor_s, arrivals_per_s=2.5))
    events = sorted(
        [(sent, 1, tokens, sent) for sent, _, tokens in prefills]
        + [(end, 0, tokens, sent) for sent, end, tokens in prefills]
    )  # ends before sends at one instant
    marks, queued_at, queued = {}, {}, 0
    for at_s, is_send, tokens, sent in events:
        if is_send:
            marks[sent] = predictor.prefill_sent("w", at_s, queued)
            queued_at[sent] = queued
            queued += tokens
            continue
        queued -= tokens
        predictor.observe_prefill(marks[sent], tokens, at_s, queued_after=queued)
        old_fit.observe_prefill(
            old_fit.prefill_sent("w", 0.0, 0), queued_at[sent] + tokens, at_s - sent, 0
        )
    assert rate * 0.6 < predictor.tokens_per_s("w") <= rate
    assert old_fit.tokens_per_s("w") > 1.3 * rate  # too fast: queues predicted too short


def test_fits_lists_only_what_was_measured_for_the_planner():
    predictor = TTFTPredictor(prior_tokens_per_s=1e6)
    assert predictor.fits() == {}  # the prior is nobody's measurement
    for tokens in range(100, 2100, 100):
        observe_alone(predictor, "p", tokens, 0.02 + tokens / 4000 + 2e-6 * tokens**2 / 1000)
    for requests in range(1, 21):
        predictor.observe_handoff("d", requests, 100 * requests, 0.01 + 0.002 * requests
                                  + 1e-5 * 100 * requests + 1e-4 * (requests % 3))  # fmt: skip
    fits = predictor.fits()
    assert set(fits) == {"p", "d"}
    assert fits["p"].prefill == pytest.approx((0.02, 1 / 4000, 2e-6), rel=1e-3, abs=1e-9)
    assert fits["p"].handoff is None and fits["d"].prefill is None
    intercept, per_request, per_token = fits["d"].handoff
    assert predictor.handoff_s("d", 7, 700) == pytest.approx(
        intercept + 7 * per_request + 700 * per_token
    )
