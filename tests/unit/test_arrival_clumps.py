"""Arrivals grouped into the clumps they came in (router/observability/arrival_clumps.py),
and what the router counts of them for the SLO planner."""

from __future__ import annotations

from router.observability.arrival_clumps import ArrivalClumps
from router.observability.metrics import RouterMetrics


def test_arrivals_within_the_window_of_the_previous_one_form_a_clump() -> None:
    clumps = ArrivalClumps(window_s=0.001)
    closed = [clumps.arrive("m", t) for t in (0.0, 0.0005, 0.0012, 0.0030, 1.0, 1.0)]
    # 0, 0.5 ms and 1.2 ms chain (each within 1 ms of the one before); 3 ms is alone.
    assert closed == [None, None, None, 3, 1, None]
    assert clumps.arrive("other", 1.0) is None  # models apart
    assert clumps.arrive("m", 5.0) == 2


def test_models_are_bounded_oldest_first() -> None:
    clumps = ArrivalClumps(window_s=0.001, max_models=2)
    for model in ("a", "b", "c"):
        clumps.arrive(model, 0.0)
    assert clumps.arrive("a", 9.0) is None  # forgotten: its open clump is not reported
    assert clumps.arrive("c", 9.0) == 1


def test_batch_lines_are_not_arrivals_the_planner_plans_a_slo_for() -> None:
    metrics = RouterMetrics(window_s=60, recent_ttft_samples=10, clock=lambda: 0.0)
    for at_s in (0.0, 0.0, 0.0, 2.0):
        metrics.observe_arrival("m", "interactive", at_s)
    metrics.observe_arrival("m", "batch", 2.0)
    text = metrics.exposition().decode()
    assert 'pdserve_arrivals_total{model="m"} 4.0' in text
    assert 'pdserve_arrival_clump_size_bucket{le="3.0",model="m"} 1.0' in text
    assert 'pdserve_arrival_clump_size_count{model="m"} 1.0' in text  # the open one: not yet
