"""The live planner's reading of the routers' /metrics (router/fleet/planner_feed.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from router.fleet.planner_feed import (
    interval_sample,
    parse_metrics,
    quantiles,
    share_under,
    worker_usd_per_hour,
)  # fmt: skip
from router.fleet.planner_model import Slo

MODEL = "m"


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(0.5, 0.125), (1.0, 0.25), (1.5, 0.375), (2.0, 0.5), (4.0, 1.0), (100.0, 1.0)],
)
def test_share_under_interpolates_inside_the_bucket(limit: float, expected: float) -> None:
    # 1 at or under 1 s, 1 more under 2 s, 2 more under 4 s; none past.
    buckets = [(1.0, 1.0), (2.0, 2.0), (4.0, 4.0), (float("inf"), 4.0)]
    assert share_under(buckets, limit) == pytest.approx(expected)


def test_share_under_with_nothing_observed_is_unknown() -> None:
    assert share_under([(1.0, 0.0), (float("inf"), 0.0)], 1.0) is None


def test_quantiles_spread_over_the_buckets() -> None:
    buckets = [(16.0, 0.0), (32.0, 4.0), (64.0, 8.0), (float("inf"), 8.0)]
    values = quantiles(buckets, 8)
    assert len(values) == 8 and values == sorted(values)
    assert all(16 <= v <= 32 for v in values[:4]) and all(32 <= v <= 64 for v in values[4:])


def metrics_text(requests: int, prompts: list[int], outputs: list[int], ttfts: list[float],
                 hits: int, queries: int, *, clumps: tuple[int, ...] = ()) -> str:  # fmt: skip
    r = CollectorRegistry()
    Counter("pdserve_arrivals", "", ["model"], registry=r).labels(MODEL).inc(requests)
    clump = Histogram("pdserve_arrival_clump_size", "", ["model"], registry=r,
                      buckets=(1.0, 2.0, 4.0, 8.0))  # fmt: skip
    for size in clumps:
        clump.labels(MODEL).observe(size)
    prompt = Histogram("pdserve_request_prompt_tokens", "", ["model"], registry=r,
                       buckets=tuple(float(2**k) for k in range(4, 18)))  # fmt: skip
    output = Histogram("pdserve_request_output_tokens", "", ["model"], registry=r,
                       buckets=tuple(float(2**k) for k in range(0, 15)))  # fmt: skip
    ttft = Histogram("pdserve_time_to_first_token_seconds", "",
                     ["model", "mode", "tenant_class", "route_stage"], registry=r,
                     buckets=(0.5, 1.0, 2.0, 4.0))  # fmt: skip
    for value in prompts:
        prompt.labels(MODEL).observe(value)
    for value in outputs:
        output.labels(MODEL).observe(value)
    for value in ttfts:
        ttft.labels(MODEL, "pd", "standard", "prod").observe(value)
        ttft.labels(MODEL, "pd", "batch", "prod").observe(value * 100)  # no SLO: not counted
    pool = ["model", "pool"]
    Counter("pdserve_pool_prefix_cache_hits", "", pool, registry=r).labels(MODEL, "prefill").inc(
        hits
    )
    Counter("pdserve_pool_prefix_cache_queries", "", pool, registry=r).labels(
        MODEL, "prefill").inc(queries)  # fmt: skip
    return generate_latest(r).decode()


def test_an_interval_from_two_scrapes_of_two_replicas() -> None:
    empty = metrics_text(0, [], [], [], 0, 0)
    before = parse_metrics([empty, empty], at_s=100.0)
    one = metrics_text(30, [1000] * 10, [100] * 10, [0.3] * 9 + [3.0], 250, 1000,
                       clumps=(1,) * 20 + (4,) * 2)  # fmt: skip
    two = metrics_text(30, [3000] * 10, [10] * 10, [0.3] * 10, 250, 1000)
    after = parse_metrics([one, two], at_s=130.0)
    sample = interval_sample(before, after, model=MODEL, slo=Slo(ttft_s=1.0, itl_s=0.1))
    assert sample.duration_s == 30.0 and sample.end_s == 130.0
    assert sample.arrivals == 60  # both replicas, every outcome
    assert len(sample.lengths) == 20
    inputs = sorted(i for i, _ in sample.lengths)
    assert all(512 <= i <= 1024 for i in inputs[:10]) and all(
        2048 <= i <= 4096 for i in inputs[10:]
    )
    assert sample.met_slo == 19  # one TTFT over the SLO; no ITL observed: not held against it
    assert sorted(sample.clump_sizes)[:20] == [1] * 20
    # Inside a bucket the sizes spread linearly, as the lengths do: (2, 4] gives 2 and 4.
    assert len(sample.clump_sizes) == 22 and sorted(sample.clump_sizes)[20:] == [2, 4]
    assert (sample.input_tokens, sample.cached_tokens) == (2000, 500)


def test_an_interval_without_answers_has_no_lengths() -> None:
    text = metrics_text(5, [], [], [], 0, 0)
    sample = interval_sample(parse_metrics([text], 0.0), parse_metrics([text], 30.0), model=MODEL,
                             slo=Slo(ttft_s=1.0, itl_s=0.1))  # fmt: skip
    assert sample.arrivals == 0 and sample.lengths == () and sample.met_slo == 0


def test_the_price_of_a_worker_hour_is_the_routers_cost_model_by_pool() -> None:
    def text(seconds: float, usd: dict[str, float]) -> str:
        r = CollectorRegistry()
        time = Counter("pdserve_worker_seconds", "", ["model", "pool", "kind"], registry=r)
        cost = Counter("pdserve_cost_usd", "", ["model", "pool"], registry=r)
        for pool, kind in (("prefill", "nvidia-h100"), ("decode", "nvidia-l40s")):
            time.labels(MODEL, pool, kind).inc(seconds)
            cost.labels(MODEL, pool).inc(usd[pool])
        return generate_latest(r).decode()

    before = parse_metrics([text(0, {"prefill": 0, "decode": 0})], 0.0)
    # A worker-minute each: $0.05 on the H100s, $0.02 on the L40S.
    after = parse_metrics([text(60, {"prefill": 0.05, "decode": 0.02})], 30.0)
    assert worker_usd_per_hour(before, after, model=MODEL, pool="prefill") == pytest.approx(3.0)
    assert worker_usd_per_hour(before, after, model=MODEL, pool="decode") == pytest.approx(1.2)
    assert worker_usd_per_hour(before, before, model=MODEL, pool="decode") is None


def pressure_text(*, router_waiting: float, fits: dict[str, tuple], batch: bool) -> str:
    """One replica's view: its own queue and fits, and the shared registry's views."""
    r = CollectorRegistry()
    Gauge("pdserve_prefill_queue_waiting_requests", "", ["model"], registry=r).labels(
        MODEL).set(router_waiting)  # fmt: skip
    pool = Gauge("pdserve_pool_queue_depth", "", ["model", "pool"], registry=r)
    pool.labels(MODEL, "prefill").set(3)
    pool.labels(MODEL, "decode").set(7)
    Gauge("pdserve_pool_kv_cache_usage_perc", "", ["model", "pool"], registry=r).labels(
        MODEL, "decode").set(0.5)  # fmt: skip
    fit = Gauge("pdserve_ttft_predictor_fit", "", ["model", "worker", "coefficient"], registry=r)
    for worker, values in fits.items():
        for coefficient, value in values:
            fit.labels(MODEL, worker, coefficient).set(value)
    fit.labels("other-model", "x", "prefill_intercept_seconds").set(9.0)
    if batch:
        Gauge("pdserve_batch_pending_lines", "", ["model"], registry=r).labels(MODEL).set(100)
        tokens = Gauge("pdserve_batch_pending_tokens", "", ["model", "direction"], registry=r)
        tokens.labels(MODEL, "input").set(50_000)
        tokens.labels(MODEL, "output").set(10_000)
        Gauge("pdserve_batch_due_lines_per_second", "", ["model"], registry=r).labels(
            MODEL).set(2.0)  # fmt: skip
    return generate_latest(r).decode()


def curve(c: float, a: float, b: float) -> tuple:
    names = ("prefill_intercept_seconds", "prefill_seconds_per_token",
             "prefill_seconds_per_token_per_ktoken")  # fmt: skip
    return tuple(zip(names, (c, a, b), strict=True))


def test_pressure_and_measured_speeds_from_two_replicas() -> None:
    one = pressure_text(router_waiting=2, fits={"p1": curve(0.01, 1e-4, 1e-6)}, batch=True)
    two = pressure_text(
        router_waiting=1, batch=False,
        fits={"p1": curve(0.03, 3e-4, 3e-6), "p2": (("prefill_intercept_seconds", 5.0),),
              "d1": (("handoff_intercept_seconds", 0.004), ("handoff_seconds_per_request", 0.001),
                     ("handoff_seconds_per_token", 2e-6))},
    )  # fmt: skip
    before = parse_metrics([one, two], 0.0)
    sample = interval_sample(before, parse_metrics([one, two], 30.0), model=MODEL,
                             slo=Slo(ttft_s=1.0, itl_s=0.1))  # fmt: skip
    seen = sample.pressure
    # Each replica's own queue adds up; the engines' queue (shared registry) counts once.
    assert seen.waiting_requests == 2 + 1 + 3
    assert seen.decode_kv_usage == 0.5 and seen.decode_preemptions == 0
    assert seen.batch is not None and seen.batch.rate_per_s == 2.0
    assert seen.batch.lengths == ((500, 100),)
    # Median over the workers that measured a whole curve (p2 has an intercept only).
    assert sample.measured_prefill == pytest.approx((0.02, 2e-4, 2e-6))
    assert sample.measured_handoff == pytest.approx((0.004, 0.001, 2e-6))
    quiet = pressure_text(router_waiting=0, fits={}, batch=False)
    nothing = interval_sample(parse_metrics([quiet], 0.0), parse_metrics([quiet], 30.0),
                              model=MODEL, slo=Slo(ttft_s=1.0, itl_s=0.1))  # fmt: skip
    assert nothing.measured_prefill is None and nothing.pressure.batch is None
