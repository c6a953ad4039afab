"""Decode admission's rules: KV room for prompt + max output, and a preemption cooldown."""

from __future__ import annotations

from contracts.workers import WorkerLoad, WorkerRegistration, WorkerRole
from router.fleet.registry import WorkerState
from router.scheduling.load import InFlight
from router.scheduling.scheduling_plugins import (
    POLICIES,
    PickContext,
    RouteQuery,
    candidate,
    has_kv_room,
    run_policy,
    thrashing,
)


def decode(worker_id: str, *, capacity: int = 10_000, usage: float = 0.0,
           preempted_at_s: float | None = None) -> WorkerState:  # fmt: skip
    registration = WorkerRegistration(
        worker_id=worker_id, role=WorkerRole.DECODE, model="m",
        engine_url="http://127.0.0.1:9", kv_capacity_tokens=capacity,
    )  # fmt: skip
    state = WorkerState(registration, last_seen_s=0.0, load=WorkerLoad(kv_cache_usage_perc=usage))
    state.preempted_at_s = preempted_at_s
    return state


def test_room_is_the_lower_of_the_engines_report_and_the_routers_reservations():
    worker = decode("d", capacity=10_000, usage=0.5)
    assert has_kv_room(worker, InFlight(1, 0, kv_tokens=1000), 5000, overcommit=1.0)
    assert not has_kv_room(worker, InFlight(1, 0, kv_tokens=1000), 5001, overcommit=1.0)
    assert not has_kv_room(decode("d"), InFlight(3, 0, kv_tokens=8000), 2001, overcommit=1.0)
    assert has_kv_room(decode("d"), InFlight(3, 0, kv_tokens=8000), 2001, overcommit=2.0)


def test_an_idle_worker_takes_any_request_and_unknown_capacity_is_unbounded():
    assert has_kv_room(decode("d", capacity=100), InFlight(), 5000, overcommit=1.0)
    unknown = decode("d", capacity=0)
    assert has_kv_room(unknown, InFlight(5, 0, kv_tokens=10**9), 10**9, overcommit=1.0)


def test_a_worker_is_thrashing_for_the_cooldown_after_its_latest_preemption():
    worker = decode("d", preempted_at_s=100.0)
    assert thrashing(worker, now_s=104.9, cooldown_s=5.0)
    assert not thrashing(worker, now_s=105.0, cooldown_s=5.0)
    assert not thrashing(decode("calm"), now_s=0.0, cooldown_s=5.0)


def pick(workers: list[WorkerState], loads: dict[str, InFlight], needed: int) -> str:
    query = RouteQuery(prompt_tokens=100, block_size=16, matched={})
    context = PickContext(
        query=query, turn=0, weights={"running_requests": 1.0}, kv_output_tokens=needed - 100,
        now_s=10.0, preemption_cooldown_s=5.0,
    )  # fmt: skip
    candidates = [candidate(w, query, loads.get(w.worker_id, InFlight())) for w in workers]
    return run_policy(POLICIES["prefix_affinity"], candidates, context).worker.worker_id


def test_the_scheduler_skips_full_and_thrashing_workers_while_another_can_take_it():
    full, thrash, roomy = decode("a-full"), decode("b-thrash", preempted_at_s=8.0), decode("c")
    loads = {"a-full": InFlight(1, 0, 9500), "c": InFlight(5, 0, 1000)}
    # "c" is the busiest by requests, yet the only one with room and no recent preemption.
    assert pick([full, thrash, roomy], loads, needed=1000) == "c"
    # With nobody suitable, the filter leaves the choice to the scorers (admission refuses
    # such requests before they get here).
    assert pick([full, thrash], loads, needed=1000) == "b-thrash"
