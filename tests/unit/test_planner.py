"""The planner's decisions: cheapest fleet meeting the SLO, with hysteresis, spacing, the
cost of change and a measured correction (router/fleet/planner.py, planner_window.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from router.fleet.planner import Planner, PlannerPolicy, moved_workers, plan
from router.fleet.planner_model import Fleet, Load, predict
from router.fleet.planner_window import IntervalSample, PlannerWindow, Pressure
from tests.unit.test_planner_model import LENGTHS, SLO, SPEEDS

POLICY = PlannerPolicy(usd_per_worker_hour=3.0, max_workers=12, min_change_interval_s=90,
                       change_cost_s=60, payback_s=1800, lead_s=60)  # fmt: skip


def load(rate: float) -> Load:
    return Load(rate_per_s=rate, lengths=LENGTHS, prefix_hit=0.0)


def decide(
    current: Fleet,
    rate: float,
    *,
    trend: float = 0.0,
    now_s: float = 1000.0,
    last_change_s: float | None = None,
    policy: PlannerPolicy = POLICY,
):
    return plan(current, load(rate), trend_per_s2=trend, speeds=SPEEDS, slo=SLO, policy=policy,
                now_s=now_s, last_change_s=last_change_s)  # fmt: skip


def cheapest_meeting(rate: float) -> Fleet:
    from router.fleet.planner_model import fleets

    ok = [f for f in fleets(2, 12) if predict(f, load(rate), SPEEDS, SLO, 3.0).meets(SLO)]
    return min(ok, key=lambda f: (f.workers, -predict(f, load(rate), SPEEDS, SLO, 3.0).attainment))


def test_a_fleet_missing_the_slo_grows_at_once_even_right_after_a_change() -> None:
    decision = decide(Fleet(prefill=1, decode=1), 6.0, last_change_s=990.0)
    assert decision.changes and decision.prediction.meets(SLO)
    assert decision.fleet.workers == cheapest_meeting(6.0).workers
    assert "would meet the SLO for" in decision.reason


def test_a_fleet_meeting_the_slo_with_nothing_cheaper_stays() -> None:
    best = cheapest_meeting(6.0)
    decision = decide(best, 6.0)
    assert not decision.changes and "nothing cheaper" in decision.reason


def test_scale_down_needs_the_margin() -> None:
    best = cheapest_meeting(6.0)
    big = Fleet(prefill=best.prefill + 2, decode=best.decode + 1)
    decision = decide(big, 6.0)
    assert decision.changes and decision.fleet.workers < big.workers
    # The chosen fleet still meets the SLO with 15% more load than forecast.
    assert predict(decision.fleet, load(6.0 * 1.15), SPEEDS, SLO, 3.0).meets(SLO)


def test_scale_down_waits_out_the_minimum_interval() -> None:
    best = cheapest_meeting(6.0)
    big = Fleet(prefill=best.prefill + 2, decode=best.decode + 1)
    assert not decide(big, 6.0, last_change_s=950.0).changes  # 50 s ago, min 90 s
    assert decide(big, 6.0, last_change_s=900.0).changes


@pytest.mark.parametrize(
    ("current", "target", "moved"),
    [((2, 2), (3, 2), (1, 0)), ((4, 2), (2, 4), (0, 2)), ((4, 4), (2, 2), (0, 0)),
     ((1, 3), (3, 1), (2, 0))],
)  # fmt: skip
def test_moved_workers_counts_starts_and_role_changes(current, target, moved) -> None:
    as_fleet = lambda pair: Fleet(prefill=pair[0], decode=pair[1])  # noqa: E731
    assert moved_workers(as_fleet(current), as_fleet(target)) == as_fleet(moved)


def test_pools_priced_apart_shift_the_split_to_the_cheaper_role() -> None:
    flat = PlannerPolicy(usd_per_worker_hour=3.0, max_workers=12)
    cheap_decode = replace(flat, usd_per_decode_worker_hour=0.5)
    kwargs = dict(trend_per_s2=0.0, speeds=SPEEDS, slo=SLO, now_s=1000.0, last_change_s=None)
    both = plan(Fleet(prefill=1, decode=1), load(6.0), policy=flat, **kwargs)
    split = plan(Fleet(prefill=1, decode=1), load(6.0), policy=cheap_decode, **kwargs)
    assert both.prediction.meets(SLO) and split.prediction.meets(SLO)
    assert split.prediction.usd_per_hour == 3.0 * split.fleet.prefill + 0.5 * split.fleet.decode
    assert split.fleet.decode >= both.fleet.decode  # decode workers cost less: no fewer
    # A budget counts each role at its own price.
    tight = replace(cheap_decode, budget_usd_per_hour=3.0 * both.fleet.prefill + 0.5 * 6)
    assert plan(Fleet(prefill=1, decode=1), load(6.0), policy=tight, **kwargs).fleet.prefill <= (
        both.fleet.prefill
    )


def test_a_fixed_total_is_re_split_when_the_split_misses() -> None:
    policy = PlannerPolicy(usd_per_worker_hour=3.0, min_workers=6, max_workers=6)
    decision = decide(Fleet(prefill=1, decode=5), 6.0, policy=policy)
    assert decision.changes and decision.fleet.workers == 6
    assert decision.fleet.prefill > 1 and decision.prediction.meets(SLO)


def test_an_upward_trend_is_planned_for_and_a_downward_one_is_not() -> None:
    best = cheapest_meeting(6.0)
    rising = decide(best, 6.0, trend=0.05)  # +3 req/s over the 60 s lead
    assert rising.forecast_rate_per_s == pytest.approx(9.0)
    assert rising.fleet.workers > best.workers
    falling = decide(best, 6.0, trend=-0.05)
    assert falling.forecast_rate_per_s == pytest.approx(6.0)


def test_out_of_reach_picks_the_cheapest_near_the_ceiling_within_budget() -> None:
    policy = PlannerPolicy(usd_per_worker_hour=3.0, max_workers=12, budget_usd_per_hour=12.0)
    decision = decide(Fleet(prefill=1, decode=1), 20.0, policy=policy)
    assert decision.fleet.workers <= 4  # $12/h buys four workers
    assert "no fleet within bounds and budget" in decision.reason


def test_planner_corrects_an_optimistic_model_with_what_it_measured() -> None:
    window = PlannerWindow(window_s=120, prior=SPEEDS)
    planner = Planner(window=window, slo=SLO, policy=POLICY)
    fleet = cheapest_meeting(4.0)
    for i in range(1, 6):
        sample = IntervalSample(end_s=30.0 * i, duration_s=30.0, arrivals=120, met_slo=80,
                                lengths=LENGTHS * 25, input_tokens=1, cached_tokens=0)  # fmt: skip
        decision = planner.step(sample, fleet, settled=True)
    assert planner.shortfall > 0.1  # predicted ~95+%, measured 80%
    assert decision is not None and decision.fleet.workers > fleet.workers
    # Not settled (a change in flight): what was measured says nothing of the model.
    unsettled = Planner(window=PlannerWindow(window_s=120, prior=SPEEDS), slo=SLO, policy=POLICY)
    unsettled.step(sample, fleet, settled=False)
    assert unsettled.shortfall == 0


def test_window_is_bounded_and_reads_rate_trend_and_hit_rate() -> None:
    window = PlannerWindow(window_s=90, prior=SPEEDS, max_lengths=10)
    assert window.load() is None
    for i in range(1, 7):  # rates 1, 2, ..., 6 req/s
        window.add(IntervalSample(end_s=30.0 * i, duration_s=30.0, arrivals=30 * i,
                                  lengths=((100, 10),) * 4, met_slo=4, input_tokens=400,
                                  cached_tokens=100))  # fmt: skip
    current = window.load()
    assert current is not None and len(current.lengths) == 10
    assert current.rate_per_s == pytest.approx(5.0)  # the last three intervals: 4, 5, 6
    assert current.prefix_hit == pytest.approx(0.25)
    assert window.trend_per_s2() == pytest.approx(1 / 30)


def test_window_fits_speeds_from_engine_busy_time() -> None:
    window = PlannerWindow(window_s=300, prior=SPEEDS, min_fit_samples=4)
    assert window.speeds() == SPEEDS
    for i, (tokens, batch) in enumerate([(1000, 4), (4000, 8), (8000, 16), (2000, 32), (6000, 2)]):
        prefill_busy = 10 * (0.01 + 5e-5 * tokens)  # 10 requests of `tokens` each
        decode_busy = 100 * (0.006 + 0.0004 * batch)  # 100 steps of `batch` sequences
        window.add(IntervalSample(end_s=30.0 * (i + 1), duration_s=30.0, arrivals=10,
                                  lengths=((tokens, 100),), met_slo=1, input_tokens=tokens,
                                  cached_tokens=0, prefill_work=((10, 10 * tokens, prefill_busy),),
                                  decode_work=((100, 100 * batch, decode_busy),)))  # fmt: skip
    fitted = window.speeds()
    assert fitted.prefill_s_per_request == pytest.approx(0.01, rel=1e-3)
    assert fitted.prefill_s_per_token == pytest.approx(5e-5, rel=1e-3)
    assert fitted.decode_step_s == pytest.approx(0.006, rel=1e-3)
    assert fitted.decode_s_per_seq == pytest.approx(0.0004, rel=1e-3)
    assert fitted.decode_s_per_ktoken == 0 and not math.isnan(fitted.handoff_s)


def test_work_waiting_now_is_planned_to_drain_within_the_lead() -> None:
    calm = decide(Fleet(prefill=2, decode=2), 2.0)
    waiting = plan(Fleet(prefill=2, decode=2), load(2.0), trend_per_s2=0.0, speeds=SPEEDS,
                   slo=SLO, policy=POLICY, now_s=1000.0, last_change_s=None,
                   pressure=Pressure(waiting_requests=240))  # fmt: skip
    assert waiting.forecast_rate_per_s == pytest.approx(calm.forecast_rate_per_s + 240 / 60)
    assert "240 waiting" in waiting.reason
    assert waiting.fleet.workers >= calm.fleet.workers


@pytest.mark.parametrize(
    "pressure",
    [Pressure(decode_preemptions=3), Pressure(decode_kv_usage=0.95)],
    ids=["preempted", "kv_full"],
)
def test_a_decode_pool_short_of_kv_gets_a_worker_more_whatever_the_model_says(pressure) -> None:
    current = cheapest_meeting(2.0)
    kwargs = dict(trend_per_s2=0.0, speeds=SPEEDS, slo=SLO, policy=POLICY, now_s=1000.0,
                  last_change_s=None)  # fmt: skip
    assert not plan(current, load(2.0), **kwargs).changes  # the model alone sees no need
    decision = plan(current, load(2.0), **kwargs, pressure=pressure)
    assert decision.fleet.decode == current.decode + 1 and decision.prediction.meets(SLO)
    assert "short of KV" in decision.reason
    # Oversized for the load, it may shrink, but never by a decode worker while short.
    big = Fleet(prefill=6, decode=current.decode + 1)
    assert plan(big, load(2.0), **kwargs).fleet.decode < big.decode
    shrunk = plan(big, load(2.0), **kwargs, pressure=pressure)
    assert shrunk.fleet.decode >= big.decode


def test_batch_lines_due_need_capacity_beside_the_slo() -> None:
    current = cheapest_meeting(2.0)
    lines = Load(rate_per_s=12.0, lengths=((4000, 200),), prefix_hit=0.0)
    decision = plan(current, load(2.0), trend_per_s2=0.0, speeds=SPEEDS, slo=SLO,
                    policy=POLICY, now_s=1000.0, last_change_s=None,
                    pressure=Pressure(batch=lines))  # fmt: skip
    assert decision.fleet.workers > current.workers
    assert decision.prediction.batch_keeps_pace and not decision.current_prediction.batch_keeps_pace
    assert "batch lines would fall behind" in decision.reason
    assert "15.00 batch lines/s" in decision.reason  # planned 25% faster than due


def test_the_routers_measured_curves_stand_until_newer_ones_come() -> None:
    window = PlannerWindow(window_s=300, prior=SPEEDS)
    base = dict(duration_s=30.0, arrivals=10, lengths=((1000, 10),), met_slo=1,
                input_tokens=1000, cached_tokens=0)  # fmt: skip
    window.add(IntervalSample(end_s=30.0, **base, measured_prefill=(0.02, 1e-4, 1e-6),
                              measured_handoff=(0.004, 0.001, 2e-6)))  # fmt: skip
    window.add(IntervalSample(end_s=60.0, **base))  # a scrape with no fit (a router restarted)
    speeds = window.speeds()
    assert speeds.prefill_s(1000) == pytest.approx(0.02 + 0.1 + 0.001)
    assert speeds.handoff_s_per_request == 0.001 and speeds.handoff_includes_first_step
    window.add(IntervalSample(end_s=90.0, **base, measured_prefill=(0.03, 1e-4, 0.0)))
    assert window.speeds().prefill_s_per_request == 0.03


def test_kv_adds_wait_for_the_last_changes_workers_to_start() -> None:
    current = cheapest_meeting(2.0)
    kwargs = dict(trend_per_s2=0.0, speeds=SPEEDS, slo=SLO, policy=POLICY,
                  pressure=Pressure(decode_preemptions=5))  # fmt: skip
    just_changed = plan(current, load(2.0), now_s=1000.0, last_change_s=970.0, **kwargs)
    assert not just_changed.changes  # 30 s ago, a start takes 60: its worker is not in yet
    later = plan(current, load(2.0), now_s=1000.0, last_change_s=930.0, **kwargs)
    assert later.fleet.decode == current.decode + 1


def test_the_window_keeps_the_clumps_arrivals_came_in() -> None:
    window = PlannerWindow(window_s=300, prior=SPEEDS, max_lengths=4)
    base = dict(duration_s=30.0, arrivals=10, lengths=((1000, 10),), met_slo=1,
                input_tokens=1000, cached_tokens=0)  # fmt: skip
    window.add(IntervalSample(end_s=30.0, **base, clump_sizes=(1, 1, 1)))
    assert window.load().clump_sizes == ()  # all alone: the model's plain queue
    window.add(IntervalSample(end_s=60.0, **base, clump_sizes=(8, 1)))
    assert window.load().clump_sizes == (1, 1, 8, 1)  # the newest max_lengths
