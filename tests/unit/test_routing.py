"""Filters, scorers and pickers: which worker each policy chooses, and why."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from contracts.workers import WorkerLoad, WorkerRegistration, WorkerRole
from router.fleet.registry import WorkerState
from router.scheduling.load import InFlight
from router.scheduling.scheduling_plugins import PickContext, RouteQuery, choose, parse_weights
from router.settings import RouterSettings

BLOCK = 16


def worker(worker_id: str, kv_usage: float = 0.0, known: bool = True) -> WorkerState:
    registration = WorkerRegistration(
        worker_id=worker_id, role=WorkerRole.PREFILL, model="m", engine_url="http://e"
    )
    load = WorkerLoad(kv_cache_usage_perc=kv_usage, known=known)
    return WorkerState(registration, 0.0, load=load)


@dataclass
class Pipeline:
    """A policy with its weights and bounds, and the rotation a pool keeps between picks."""

    policy: str
    weights: dict[str, float]
    epsilon: float
    load_floor: int = 0
    token_floor: int = 0
    turn: int = 0

    def pick(self, workers, query, inflight, exclude=(), yields=False):
        context = PickContext(
            query=query, turn=self.turn, weights=self.weights, epsilon=self.epsilon,
            load_floor=self.load_floor, token_floor=self.token_floor, yields=yields,
        )  # fmt: skip
        self.turn += 1
        return choose(self.policy, workers, context, inflight, exclude)


def affinity(epsilon: float = 0.25) -> Pipeline:
    return Pipeline("prefix_affinity", parse_weights("uncached_tokens=1,queued_tokens=0.25"),
                    epsilon)  # fmt: skip


def pick(pipeline, workers, matched, loads=None, prompt_tokens=10 * BLOCK, exclude=(),
         yields=False):  # fmt: skip
    loads = loads or {}
    query = RouteQuery(prompt_tokens=prompt_tokens, block_size=BLOCK, matched=matched)
    return pipeline.pick(workers, query, lambda w: loads.get(w, InFlight()), exclude, yields)


def test_prefix_affinity_goes_where_the_prefix_is_cached():
    workers = [worker("a"), worker("b"), worker("c")]
    decision = pick(affinity(), workers, {"b": 8, "c": 2})
    assert (decision.worker.worker_id, decision.reason) == ("b", "prefix_hit")
    assert decision.uncached_tokens == 2 * BLOCK


def test_a_batch_line_goes_where_no_other_prefill_is_under_way_despite_its_prefix():
    workers = [worker("a"), worker("b"), worker("c")]
    loads = {
        "a": InFlight(requests=1, tokens=BLOCK),  # another request's prefill
        "b": InFlight(requests=1, tokens=BLOCK, yielding_tokens=BLOCK),
    }  # a batch line's
    assert pick(affinity(), workers, {"a": 9, "b": 8}, loads).worker.worker_id == "a"
    line = pick(affinity(), workers, {"a": 9, "b": 8}, loads, yields=True)
    assert line.worker.worker_id == "c"  # holding no batch work, before b's hit beside one
    batch_on_c = {**loads, "c": InFlight(requests=1, tokens=BLOCK, yielding_tokens=BLOCK)}
    line = pick(affinity(), workers, {"a": 9, "b": 8}, batch_on_c, yields=True)
    assert line.worker.worker_id == "b"  # equal batch work: the best hit left
    everywhere = {w: InFlight(requests=1, tokens=BLOCK) for w in ("a", "b", "c")}
    assert pick(affinity(), workers, {"a": 9}, everywhere, yields=True).worker.worker_id == "a"


def test_a_worker_at_its_load_bound_loses_affinity_and_the_prefix_spills():
    workers = [worker("a"), worker("b")]
    # 3 in flight on a, none on b: mean with this request is 2, bound ceil(1.25 * 2) = 3.
    loads = {"a": InFlight(requests=3, tokens=3 * BLOCK)}
    decision = pick(affinity(), workers, {"a": 10}, loads)
    assert (decision.worker.worker_id, decision.reason) == ("b", "bounded_load_spill")


def test_below_its_bound_a_busier_worker_keeps_its_prefix_hits():
    workers = [worker("a"), worker("b")]
    loads = {"a": InFlight(requests=1, tokens=BLOCK)}
    decision = pick(affinity(), workers, {"a": 10}, loads)
    assert (decision.worker.worker_id, decision.reason) == ("a", "prefix_hit")


def test_the_bound_is_decided_per_candidate_not_fleet_wide():
    # One worker is overloaded; the prefix lives on another, within its bound: keep it.
    workers = [worker("a"), worker("b"), worker("c")]
    loads = {"a": InFlight(requests=9), "b": InFlight(requests=1)}
    decision = pick(affinity(), workers, {"b": 10}, loads)
    assert decision.worker.worker_id == "b"


def test_a_long_prefill_queue_takes_affinity_when_tokens_are_bounded():
    # One request in flight on a (well under the request bound), but 16k tokens of it:
    # a short prompt sent there by affinity would wait for the whole long prefill.
    workers = [worker("a"), worker("b"), worker("c")]
    loads = {"a": InFlight(requests=1, tokens=16_000)}
    weights = parse_weights("uncached_tokens=1")
    by_requests = Pipeline("prefix_affinity", weights, 0.25, load_floor=4)
    assert pick(by_requests, workers, {"a": 10}, loads).worker.worker_id == "a"
    by_tokens = Pipeline("prefix_affinity", weights, 0.25, load_floor=4, token_floor=2048)
    decision = pick(by_tokens, workers, {"a": 10}, loads)
    assert (decision.worker.worker_id, decision.reason) != ("a", "prefix_hit")
    assert decision.reason == "bounded_load_spill"


def test_below_the_token_floor_a_queue_keeps_its_affinity():
    workers = [worker("a"), worker("b")]
    loads = {"a": InFlight(requests=1, tokens=1000)}
    pipeline = Pipeline("prefix_affinity", parse_weights("uncached_tokens=1"), 0.25,
                        load_floor=4, token_floor=2048)  # fmt: skip
    assert pick(pipeline, workers, {"a": 10}, loads).reason == "prefix_hit"


def test_queued_tokens_outweigh_a_small_hit():
    workers = [worker("a"), worker("b")]
    loads = {"a": InFlight(requests=1, tokens=5000)}
    decision = pick(affinity(epsilon=10), workers, {"a": 1}, loads)
    assert (decision.worker.worker_id, decision.reason) == ("b", "load")


def test_equal_workers_share_load_by_rotation():
    pipeline = affinity()
    workers = [worker("a"), worker("b")]
    chosen = [pick(pipeline, workers, {}).worker.worker_id for _ in range(4)]
    assert sorted(chosen) == ["a", "a", "b", "b"]


def test_excluded_workers_are_never_picked_and_none_left_is_none():
    workers = [worker("a"), worker("b")]
    assert pick(affinity(), workers, {"a": 10}, exclude=("a",)).worker.worker_id == "b"
    assert pick(affinity(), workers, {}, exclude=("a", "b")) is None


def test_round_robin_ignores_the_cache_and_least_loaded_reads_in_flight_requests():
    workers = [worker("a"), worker("b"), worker("c")]
    rr = Pipeline("round_robin", {}, 0.25)
    assert [pick(rr, workers, {"a": 10}).worker.worker_id for _ in range(3)] == ["a", "b", "c"]
    least = Pipeline("least_loaded", {}, 0.25)
    loads = {"a": InFlight(requests=2), "c": InFlight(requests=1)}
    decision = pick(least, workers, {"a": 10}, loads)
    assert (decision.worker.worker_id, decision.reason) == ("b", "least_loaded")


def test_bad_scorers_and_policies_are_refused_whole():
    with pytest.raises(ValueError, match="unknown scorer"):
        parse_weights("uncached_tokens=1,telepathy=2")
    with pytest.raises(ValueError, match="numeric weight"):
        parse_weights("uncached_tokens=lots")
    with pytest.raises(ValueError, match="routing_policy_by_model"):
        RouterSettings(routing_policy_by_model="m=random")
    with pytest.raises(ValueError):
        RouterSettings(routing_policy="random")
    assert RouterSettings(routing_policy_by_model="a=round_robin, b=least_loaded")\
        .routing.policies_by_model() == {"a": "round_robin", "b": "least_loaded"}  # fmt: skip


@pytest.mark.parametrize("policy", ["prefix_affinity", "least_loaded", "round_robin"])
def test_a_worker_whose_load_is_unknown_is_used_only_when_no_load_is_known(policy):
    pipeline = Pipeline(policy, parse_weights("uncached_tokens=1"), 0.25)
    blind = worker("a", known=False)  # its zeros look idle, and it holds the prefix
    busy = worker("b", kv_usage=0.9)
    for _ in range(4):
        decision = pick(pipeline, [blind, busy], {"a": 8}, loads={"b": InFlight(requests=5)})
        assert decision.worker.worker_id == "b"
    assert pick(pipeline, [blind], {}).worker.worker_id == "a"


def test_a_plugin_name_cannot_be_registered_twice():
    from router.scheduling.scheduling_plugins import FILTERS, register_filter

    with pytest.raises(ValueError, match="already registered"):
        register_filter("bounded_load")(lambda candidates, context: candidates)
    assert FILTERS["bounded_load"].__name__ == "bounded_load"


def deadline_pick(workers, matched, loads, *, now_s, deadline_s, seconds_per_token):
    """prefix_affinity with a prefill deadline, every worker draining at one rate."""
    query = RouteQuery(prompt_tokens=10 * BLOCK, block_size=BLOCK, matched=matched)
    context = PickContext(
        query=query, turn=0, weights=parse_weights("uncached_tokens=1,queued_tokens=0.02"),
        epsilon=10, now_s=now_s, prefill_deadline_s=deadline_s,
        predict_prefill_s=lambda c: (c.inflight.tokens + c.uncached_tokens) * seconds_per_token,
    )  # fmt: skip
    return choose("prefix_affinity", workers, context, lambda w: loads.get(w, InFlight()))


def in_flight(tokens: int, *deadlines_s: float) -> InFlight:
    load = InFlight(requests=len(deadlines_s), tokens=tokens)
    for deadline_s in deadlines_s:
        load._add_deadline(deadline_s)
    return load


def test_the_cached_worker_keeps_its_affinity_while_it_can_serve_in_time():
    loads = {"a": in_flight(320, 9.0)}
    # a: (320 + 32) ms = 0.35 s; b: 160 ms, but cold. Both in time: the prefix wins.
    decision = deadline_pick([worker("a"), worker("b")], {"a": 8}, loads,
                             now_s=0.0, deadline_s=1.0, seconds_per_token=0.001)  # fmt: skip
    assert (decision.worker.worker_id, decision.reason) == ("a", "prefix_hit")


def test_a_prefix_worker_that_would_end_it_late_loses_it_to_one_in_time():
    loads = {"a": in_flight(1200, 9.0)}
    decision = deadline_pick([worker("a"), worker("b")], {"a": 8}, loads,
                             now_s=0.0, deadline_s=1.0, seconds_per_token=0.001)  # fmt: skip
    assert decision.worker.worker_id == "b"


def test_work_that_would_push_an_earlier_prefill_past_its_deadline_goes_elsewhere():
    # a would end this one at 0.35 s, in its own time, but a prefill already there is due
    # at 0.3 s: an engine prefills what waits together, so this one would make it late.
    loads = {"a": in_flight(320, 0.3), "b": in_flight(400, 5.0)}
    decision = deadline_pick([worker("a"), worker("b")], {"a": 8}, loads,
                             now_s=0.0, deadline_s=1.0, seconds_per_token=0.001)  # fmt: skip
    assert decision.worker.worker_id == "b"


def test_when_no_worker_is_in_time_the_least_late_one_is_picked():
    loads = {"a": in_flight(3000, 9.0), "b": in_flight(2000, 9.0)}
    decision = deadline_pick([worker("a"), worker("b")], {"a": 8}, loads,
                             now_s=0.0, deadline_s=1.0, seconds_per_token=0.001)  # fmt: skip
    assert decision.worker.worker_id == "b"
