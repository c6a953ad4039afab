"""The planner's model: queueing on measured speeds (router/fleet/planner_model.py)."""

from __future__ import annotations

import math

import pytest

from router.fleet.planner_model import (
    Fleet,
    Load,
    Slo,
    Speeds,
    arrival_clumps,
    arrival_cv2,
    erlang_c,
    fleets,
    predict,
    with_measured,
)  # fmt: skip

SPEEDS = Speeds(
    prefill_s_per_request=0.005, prefill_s_per_token=3e-5, decode_step_s=0.005,
    decode_s_per_seq=2e-5, decode_s_per_ktoken=4e-5, handoff_s=0.002,
    handoff_s_per_ktoken=0.005, kv_capacity_tokens=400_000, max_num_seqs=256,
)  # fmt: skip
SLO = Slo(ttft_s=2.0, itl_s=0.04)
LENGTHS = ((2000, 200), (8000, 400), (30000, 100), (4000, 300))


def load(rate: float, lengths: tuple = LENGTHS, hit: float = 0.0) -> Load:
    return Load(rate_per_s=rate, lengths=lengths, prefix_hit=hit)


@pytest.mark.parametrize(
    ("servers", "offered", "expected"),
    [(1, 0.5, 0.5), (2, 1.0, 1 / 3), (1, 0.9, 0.9), (3, 2.0, 4 / 9)],
)
def test_erlang_c_matches_closed_forms(servers: int, offered: float, expected: float) -> None:
    assert erlang_c(servers, offered) == pytest.approx(expected)


def test_erlang_c_is_stable_for_thousands_of_servers() -> None:
    assert 0 < erlang_c(4096, 4000.0) < 1
    assert erlang_c(4096, 3000.0) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("rate", [1.0, 4.0, 8.0])
def test_more_workers_never_predict_worse(rate: float) -> None:
    for prefill in range(1, 8):
        for decode in range(1, 4):
            base = predict(Fleet(prefill=prefill, decode=decode), load(rate), SPEEDS, SLO, 1.0)
            more_p = predict(
                Fleet(prefill=prefill + 1, decode=decode), load(rate), SPEEDS, SLO, 1.0
            )
            more_d = predict(
                Fleet(prefill=prefill, decode=decode + 1), load(rate), SPEEDS, SLO, 1.0
            )
            assert more_p.attainment >= base.attainment - 1e-12
            assert more_d.attainment >= base.attainment - 1e-12


def test_a_saturated_pool_predicts_no_attainment() -> None:
    # Mean prefill ~0.33 s: 2 workers hold ~6 req/s.
    prefill_bound = predict(Fleet(prefill=2, decode=8), load(10.0), SPEEDS, SLO, 1.0)
    assert prefill_bound.prefill_utilization >= 1 and prefill_bound.attainment == 0
    # 1 decode worker: each live sequence holds ~12k tokens of KV, so ~32 fit; 10 req/s x
    # ~250 tokens x ~20 ms per step keeps ~50 in flight.
    kv_bound = predict(Fleet(prefill=8, decode=1), load(10.0), SPEEDS, SLO, 1.0)
    assert kv_bound.attainment == 0


def test_a_prompt_too_long_for_the_slo_always_misses() -> None:
    # 100k tokens take 3 s to prefill alone: no fleet meets a 2 s TTFT for it.
    lengths = ((100_000, 10), (1000, 10), (1000, 10), (1000, 10))
    best = predict(Fleet(prefill=16, decode=4), load(0.1, lengths), SPEEDS, SLO, 1.0)
    assert best.ttft_attainment == pytest.approx(0.75, abs=0.01)


def test_the_prefix_hit_rate_shortens_prefill() -> None:
    cold = predict(Fleet(prefill=2, decode=2), load(5.0, hit=0.0), SPEEDS, SLO, 1.0)
    warm = predict(Fleet(prefill=2, decode=2), load(5.0, hit=0.5), SPEEDS, SLO, 1.0)
    assert warm.prefill_utilization == pytest.approx(cold.prefill_utilization * 0.5, rel=0.05)
    assert warm.ttft_attainment > cold.ttft_attainment


def test_cost_per_million_tokens() -> None:
    p = predict(Fleet(prefill=3, decode=1), load(2.0), SPEEDS, SLO, 2.5)
    tokens_per_hour = 2.0 * 3600 * sum(i + o for i, o in LENGTHS) / len(LENGTHS)
    assert p.usd_per_hour == 10.0
    assert p.usd_per_million_tokens == pytest.approx(10.0 / tokens_per_hour * 1e6)


def test_a_light_load_meets_the_slo_on_the_smallest_fleet() -> None:
    p = predict(Fleet(prefill=1, decode=1), load(0.2, LENGTHS[:2]), SPEEDS, SLO, 1.0)
    assert p.meets(SLO) and p.itl_s < SLO.itl_s and not math.isinf(p.decode_batch)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Load(rate_per_s=1.0, lengths=(), prefix_hit=0.0)
    with pytest.raises(ValueError, match="prefix_hit"):
        Load(rate_per_s=1.0, lengths=LENGTHS, prefix_hit=1.5)
    with pytest.raises(ValueError, match="at least one prefill"):
        predict(Fleet(prefill=0, decode=2), load(1.0), SPEEDS, SLO, 1.0)


def test_fleets_lists_every_split_in_the_bounds() -> None:
    assert [str(f) for f in fleets(2, 4)] == ["1P+1D", "1P+2D", "2P+1D", "1P+3D", "2P+2D", "3P+1D"]


def test_clumped_arrivals_wait_longer_than_poisson_ones() -> None:
    assert arrival_cv2([0.0, 1.0, 2.0, 3.0]) == pytest.approx(1e-3)  # evenly spaced: floor
    clumps = [0.0] * 10 + [3.0] * 10 + [6.0] * 10
    assert arrival_cv2(clumps) > 5
    poisson = predict(Fleet(prefill=2, decode=2), load(4.0), SPEEDS, SLO, 1.0)
    bursty = predict(Fleet(prefill=2, decode=2), Load(rate_per_s=4.0, lengths=LENGTHS,
                     prefix_hit=0.0, arrival_cv2=8.0), SPEEDS, SLO, 1.0)  # fmt: skip
    assert bursty.ttft_attainment < poisson.ttft_attainment


def test_measured_curves_replace_the_priors() -> None:
    measured = with_measured(SPEEDS, prefill=(0.01, 1e-4, 2e-6), handoff=(0.003, 0.002, 4e-6))
    # A prefill alone: intercept + n x (per token + per token per ktoken x n / 1000).
    assert measured.prefill_s(1000) == pytest.approx(0.01 + 1000 * (1e-4 + 2e-6))
    assert measured.handoff_s_per_ktoken == pytest.approx(0.004)
    assert measured.handoff_includes_first_step and not SPEEDS.handoff_includes_first_step
    assert with_measured(SPEEDS, prefill=None, handoff=None) == SPEEDS
    # The square term is what makes a long prompt miss where a line would not.
    line = with_measured(SPEEDS, prefill=(0.01, 3e-5, 0.0), handoff=None)
    square = with_measured(SPEEDS, prefill=(0.01, 3e-5, 3e-6), handoff=None)
    long_prompts = load(0.1, ((30000, 50),))
    assert predict(Fleet(prefill=2, decode=1), long_prompts, line, SLO, 1.0).meets(SLO)
    assert not predict(Fleet(prefill=2, decode=1), long_prompts, square, SLO, 1.0).meets(SLO)


def test_a_measured_handoff_grows_with_the_decode_batch() -> None:
    # 0.1 s per request in flight on the decode worker: a busier decode pool, a later first
    # token; the profile's first step (no handoff term) is not counted twice.
    measured = with_measured(SPEEDS, prefill=None, handoff=(0.0, 0.1, 0.0))
    light = predict(Fleet(prefill=4, decode=8), load(3.0), measured, SLO, 1.0)
    heavy = predict(Fleet(prefill=4, decode=1), load(3.0), measured, SLO, 1.0)
    assert heavy.decode_batch > light.decode_batch
    assert heavy.ttft_attainment < light.ttft_attainment


def test_batch_lines_take_capacity_but_barely_delay_interactive_requests() -> None:
    fleet = Fleet(prefill=2, decode=2)
    alone = predict(fleet, load(1.0), SPEEDS, SLO, 1.0)
    lines = Load(rate_per_s=2.0, lengths=((2000, 100),), prefix_hit=0.0)
    beside = predict(fleet, load(1.0), SPEEDS, SLO, 1.0, batch=lines)
    assert beside.prefill_utilization > alone.prefill_utilization
    assert beside.batch_keeps_pace and beside.meets(SLO)
    # Served at the lowest priority, they delay a request only by a residual prefill.
    assert alone.ttft_attainment - 0.02 <= beside.ttft_attainment <= alone.ttft_attainment
    assert beside.decode_batch > alone.decode_batch  # but they share the decode batches
    assert beside.usd_per_million_tokens < alone.usd_per_million_tokens
    flood = Load(rate_per_s=60.0, lengths=((2000, 100),), prefix_hit=0.0)
    behind = predict(fleet, load(1.0), SPEEDS, SLO, 1.0, batch=flood)
    assert not behind.batch_keeps_pace and not behind.meets(SLO)


def test_a_clumps_requests_wait_for_each_other_a_round_per_p_ahead() -> None:
    sizes, between = arrival_clumps([0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 6.0, 6.0, 9.0])
    assert sizes == (5, 1, 2, 1) and between == pytest.approx(1e-3)  # clumps evenly spaced
    clumped = Load(rate_per_s=1.0, lengths=LENGTHS[:1], prefix_hit=0.0, clump_sizes=sizes)
    # Of 9 requests on 2 servers: 6 start at once, 2 wait a round (the 5-clump's 3rd
    # and 4th), 1 waits two (its 5th).
    assert clumped.rounds_behind(2) == pytest.approx({0: 6 / 9, 1: 2 / 9, 2: 1 / 9})
    assert clumped.rounds_behind(8) == {0: pytest.approx(1.0)}
    # The same rate in clumps of 10 misses where it came alone: on two workers a clump's
    # last two wait four rounds of 0.6-s prefills, its 5th-8th two or three: only the
    # first three rounds (60%) fit in the 2-s SLO.
    alone = load(0.5, ((20000, 50),))
    together = Load(rate_per_s=0.5, lengths=((20000, 50),), prefix_hit=0.0,
                    clump_sizes=(10,) * 10)  # fmt: skip
    fleet = Fleet(prefill=2, decode=1)
    assert predict(fleet, alone, SPEEDS, SLO, 1.0).ttft_attainment > 0.95
    assert 0.55 < predict(fleet, together, SPEEDS, SLO, 1.0).ttft_attainment < 0.61
    more = predict(Fleet(prefill=10, decode=1), together, SPEEDS, SLO, 1.0)
    assert more.ttft_attainment > 0.95
    with pytest.raises(ValueError, match="clump"):
        Load(rate_per_s=1.0, lengths=LENGTHS, prefix_hit=0.0, clump_sizes=(0,))
