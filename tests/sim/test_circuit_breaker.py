"""A decode worker that answers /health but fails every request (a wedged KV transfer,
as after a peer restart) is taken out by its circuit breaker, not put back by each
passing probe; once it works again, a trial request closes the circuit. Clients see
none of it: each failed attempt is retried on the other decode worker."""

from __future__ import annotations

import itertools

import pytest

from loadgen.prometheus_text import scrape, total
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import generate
from tests.sim.faults import set_faults

WEDGED = "decode-0"
_asked = itertools.count()


def ask(cluster) -> int:
    # A new prompt each time: prefix affinity would otherwise keep choosing one decode.
    body = {"model": MODEL, "prompt": f"circuit {next(_asked)} " * 8, "max_tokens": 2}
    return generate(cluster.router_url, "/v1/completions", body).status


def circuit(cluster) -> str:
    return cluster.worker_status()[WEDGED]["circuit"]


def routed_to_wedged(cluster) -> float:
    return total(scrape(cluster.router_url + "/metrics"), "pdserve_routed_requests_total",
                 worker=WEDGED)  # fmt: skip


@pytest.mark.slow  # 8 s of the fast tier; tests/unit/test_circuit_breaker.py covers the states
def test_a_worker_failing_every_request_is_held_out_by_its_circuit_until_a_trial_passes(
    sim_cluster,
):
    families = scrape(sim_cluster.router_url + "/metrics")
    trips_before = total(families, "pdserve_worker_circuit_trips_total", worker=WEDGED)
    statuses: list[int] = []
    assert set_faults(sim_cluster, WEDGED, transfer_failure_probability=1.0).status_code == 200
    try:
        wait_for(lambda: statuses.append(ask(sim_cluster)) or circuit(sim_cluster) == "open",
                 30, f"{WEDGED}'s circuit to open")  # fmt: skip
        routed = routed_to_wedged(sim_cluster)
        statuses += [ask(sim_cluster) for _ in range(4)]
        # Its probes pass all along: before, each one put it back in rotation.
        assert routed_to_wedged(sim_cluster) == routed, "no request while the circuit is open"
        assert sim_cluster.worker_status()[WEDGED]["healthy"]
    finally:
        set_faults(sim_cluster, WEDGED, transfer_failure_probability=0.0)
    assert set(statuses) == {200}, "every failed attempt was retried elsewhere"
    wait_for(lambda: statuses.append(ask(sim_cluster)) or circuit(sim_cluster) == "closed",
             30, f"a trial request to close {WEDGED}'s circuit")  # fmt: skip
    families = scrape(sim_cluster.router_url + "/metrics")
    assert total(families, "pdserve_worker_circuit_trips_total", worker=WEDGED) == trips_before + 1
    assert total(families, "pdserve_worker_circuit_open", worker=WEDGED) == 0
