"""Cache-aware routing on the sim cluster: affinity with a load bound, restarts, lost events.

Prompts are token ids, so their blocks are exact: a shared prefix of PREFIX_BLOCKS
full blocks (tiny-cpu's block is 128 tokens) and a short unique tail.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import httpx

from loadgen.prometheus_text import scrape, total
from router.settings import RouterSettings
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import generate
from tests.sim.faults import set_faults

BLOCK = 128
PREFIX_BLOCKS = 3
PREFILLS = ("prefill-0", "prefill-1")


def prefix_prompt(prefix: int, tail: int) -> list[int]:
    shared = [1000 + (prefix * 7919 + i) % 3000 for i in range(PREFIX_BLOCKS * BLOCK)]
    return [*shared, 50 + tail, 60 + tail, 70 + tail]


def unique_prompt(blocks: int = 2) -> list[int]:
    seed = uuid.uuid4().int
    return [100 + (seed >> (i % 100)) % 3000 for i in range(blocks * BLOCK + 5)]


def metric(cluster, name: str, **labels: str) -> float:
    return total(scrape(cluster.router_url + "/metrics"), name, **labels)


def routed(cluster) -> dict[str, float]:
    samples = scrape(cluster.router_url + "/metrics")
    return {w: total(samples, "pdserve_routed_requests_total", worker=w) for w in PREFILLS}


def complete(cluster, prompt: list[int]) -> int:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    return generate(cluster.router_url, "/v1/completions", body).status


def send_and_see_where(cluster, prompt: list[int], threads: list[threading.Thread]) -> str:
    """Start a request in the background; return the prefill worker it was routed to."""
    before = routed(cluster)
    thread = threading.Thread(target=complete, args=(cluster, prompt))
    thread.start()
    threads.append(thread)
    wait_for(
        lambda: any(n > before[w] for w, n in routed(cluster).items()),
        30, "the router to choose a prefill worker",
    )  # fmt: skip
    (chosen,) = [w for w, n in routed(cluster).items() if n > before[w]]
    return chosen


def test_a_same_prefix_burst_stays_on_one_prefill_until_its_load_bound_then_spills(sim_cluster):
    # The bound is from the mean load, so requests of earlier tests still in flight on this
    # shared cluster would raise it: the burst starts on idle prefill workers.
    wait_for(
        lambda: all(metric(sim_cluster, "pdserve_worker_inflight_requests", worker=w) == 0
                    for w in PREFILLS),
        60, "earlier requests on the prefill workers to end",
    )  # fmt: skip
    spills_before = metric(sim_cluster, "pdserve_routing_decisions_total", pool="prefill",
                           reason="bounded_load_spill")  # fmt: skip
    for name in PREFILLS:  # prefills take seconds, so the burst is in flight together
        assert set_faults(sim_cluster, name, slowdown=100).status_code == 200
    threads: list[threading.Thread] = []
    # With 2 prefill workers and the default epsilon (0.5) the mean-based bound stays at
    # or below the floor for this burst, so the floor is where the prefix's worker stops.
    floor = RouterSettings().routing.bounded_load_floor
    try:
        order = [send_and_see_where(sim_cluster, prefix_prompt(1, i), threads)
                 for i in range(floor + 1)]  # fmt: skip
    finally:
        for name in PREFILLS:
            set_faults(sim_cluster, name, slowdown=1)
        for thread in threads:
            thread.join(timeout=60)
    assert order[:floor] == [order[0]] * floor, "the prefix stays on one worker up to its bound"
    assert order[floor] != order[0], "then it spills"
    spills = metric(sim_cluster, "pdserve_routing_decisions_total", pool="prefill",
                    reason="bounded_load_spill")  # fmt: skip
    assert spills == spills_before + 1


def index_blocks(cluster, worker: str) -> float:
    return metric(cluster, "pdserve_prefix_index_worker_blocks", worker=worker)


def test_a_restarted_prefill_starts_with_an_empty_index(sim_cluster):
    threads: list[threading.Thread] = []
    worker = send_and_see_where(sim_cluster, unique_prompt(blocks=3), threads)
    threads[0].join(timeout=30)
    wait_for(lambda: index_blocks(sim_cluster, worker) >= 3, 10, "its blocks in the index")
    before = sim_cluster.worker_status()[worker]["incarnation"]
    with contextlib.suppress(httpx.HTTPError):
        set_faults(sim_cluster, worker, crash=True)
    wait_for(
        lambda: (w := sim_cluster.worker_status().get(worker)) is not None
        and w["eligible"] and w["incarnation"] > before,
        60, "the agent to restart the crashed sim",
    )  # fmt: skip
    assert index_blocks(sim_cluster, worker) == 0


def direct_completion(cluster, worker: str) -> None:
    body = {"model": MODEL, "prompt": unique_prompt(), "max_tokens": 1}
    url = cluster.worker(worker).engine_url + "/v1/completions"
    assert httpx.post(url, json=body, timeout=30).status_code == 200


def test_when_kv_events_are_lost_the_approximate_index_keeps_a_prefix_together(sim_cluster):
    batches = lambda w: metric(sim_cluster, "pdserve_kv_event_batches_total",  # noqa: E731
                               worker=w, kind="batch")  # fmt: skip
    gaps = lambda w: metric(sim_cluster, "pdserve_kv_event_batches_total",  # noqa: E731
                            worker=w, kind="gap")  # fmt: skip
    try:
        for name in PREFILLS:  # the feed has seen this engine's sequence...
            seen = batches(name)
            direct_completion(sim_cluster, name)
            wait_for(lambda n=name, s=seen: batches(n) > s, 10, f"{name}'s events")
        gaps_before = {name: gaps(name) for name in PREFILLS}
        for name in PREFILLS:  # ...then loses a batch, and notices with the next one.
            set_faults(sim_cluster, name, kv_event_drop_probability=1.0)
            direct_completion(sim_cluster, name)
            set_faults(sim_cluster, name, kv_event_drop_probability=0.0)
            direct_completion(sim_cluster, name)
        for name in PREFILLS:
            wait_for(lambda n=name: gaps(n) > gaps_before[n], 10, f"a gap seen on {name}")
            set_faults(sim_cluster, name, kv_event_drop_probability=1.0)  # and stays blind
        hits_before = metric(sim_cluster, "pdserve_routing_decisions_total", pool="prefill",
                             reason="prefix_hit")  # fmt: skip
        threads: list[threading.Thread] = []
        first = send_and_see_where(sim_cluster, prefix_prompt(2, 0), threads)
        threads[0].join(timeout=30)
        # Past the 1 s speculative TTL (the cluster's setting): only the approximate
        # index, which the gap switched on for these workers, still remembers the prefix.
        time.sleep(1.5)
        later = [send_and_see_where(sim_cluster, prefix_prompt(2, i), threads)
                 for i in range(1, 5)]  # fmt: skip
        for thread in threads:
            thread.join(timeout=30)
        assert later == [first] * 4
        hits = metric(sim_cluster, "pdserve_routing_decisions_total", pool="prefill",
                      reason="prefix_hit")  # fmt: skip
        assert hits == hits_before + 4
    finally:
        for name in PREFILLS:
            set_faults(sim_cluster, name, kv_event_drop_probability=0.0)


def test_a_prefix_cache_reset_reaches_the_index_as_all_blocks_cleared(sim_cluster):
    threads: list[threading.Thread] = []
    worker = send_and_see_where(sim_cluster, unique_prompt(blocks=2), threads)
    threads[0].join(timeout=30)
    wait_for(lambda: index_blocks(sim_cluster, worker) >= 2, 10, "its blocks in the index")
    reset = httpx.post(
        sim_cluster.worker(worker).engine_url + "/reset_prefix_cache",
        headers={"Authorization": f"Bearer {sim_cluster.engine_token}"},
    )
    assert reset.status_code == 200
    wait_for(lambda: index_blocks(sim_cluster, worker) == 0, 10, "AllBlocksCleared applied")


def test_an_alias_serves_the_same_pool_under_its_own_policy(sim_cluster):
    alias = f"{MODEL}-rr"
    listed = httpx.get(sim_cluster.router_url + "/v1/models").json()["data"]
    assert alias in {m["id"] for m in listed}

    def decisions_by_policy() -> dict[str, float]:
        samples = scrape(sim_cluster.router_url + "/metrics")
        return {
            policy: total(samples, "pdserve_routing_decisions_total", model=alias, policy=policy)
            for policy in ("round_robin", "prefix_affinity")
        }

    before = decisions_by_policy()
    body = {"model": alias, "prompt": unique_prompt(blocks=1), "max_tokens": 2}
    result = generate(sim_cluster.router_url, "/v1/completions", body)
    assert result.status == 200, result.body
    after = decisions_by_policy()
    assert after["round_robin"] == before["round_robin"] + 2  # a prefill and a decode choice
    assert after["prefix_affinity"] == before["prefix_affinity"]
