"""A P/D request whose every prefill (or decode) attempt fails is answered whole by the
other pool (``serve_degraded``, on by default), as when that pool is empty: the client
gets the answer, not a 502. A sim cluster of its own, one prefill and one decode, so
the one worker of a phase failing leaves no other of its pool to retry on."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import httpx
import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster
from modelstore import tiny_llama
from tests.clusters import small_sim_cluster
from tests.conditions import wait_for
from tests.generation import Generation, generate
from tests.sim.faults import set_faults

MODEL = tiny_llama.SERVED_NAME
BODY = {"model": MODEL, "prompt": "a prompt computed twice " * 30, "max_tokens": 24,
        "temperature": 0}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with small_sim_cluster(tmp_path_factory.mktemp("fallback")) as local:
        yield local


def running(cluster: LocalCluster, worker: str) -> float:
    families = scrape(cluster.worker(worker).engine_url + "/metrics")
    return total(families, "vllm:num_requests_running")


def served_alone(cluster: LocalCluster, pool: str) -> float:
    families = scrape(cluster.router_url + "/metrics")
    return total(families, "pdserve_degraded_requests_total", model=MODEL, pool=pool)


def crash_while_it_serves(cluster: LocalCluster, worker: str, body: dict) -> Generation:
    """Ask in the background, slow ``worker`` so the request stays on it, and crash it
    there (the agent restarts it): what the client got, once the worker is back."""
    incarnation = cluster.worker_status()[worker]["incarnation"]
    assert set_faults(cluster, worker, slowdown=200).status_code == 200
    answer: list[Generation] = []
    asking = threading.Thread(
        target=lambda: answer.append(generate(cluster.router_url, "/v1/completions", body))
    )
    asking.start()
    try:
        wait_for(lambda: running(cluster, worker) > 0, 20, f"the request to reach {worker}")
        with contextlib.suppress(httpx.HTTPError):  # it dies before it answers
            set_faults(cluster, worker, crash=True)
        asking.join(timeout=60)
    finally:
        wait_for(
            lambda: (w := cluster.worker_status().get(worker)) is not None
            and w["eligible"] and w["incarnation"] > incarnation,
            60, f"the agent to restart {worker}",
        )  # fmt: skip
    assert answer, "no answer within 60 s"
    return answer[0]


@pytest.mark.parametrize(("crashed", "left"), [("prefill-0", "decode"), ("decode-0", "prefill")])
def test_a_request_whose_only_worker_of_a_phase_dies_is_answered_by_the_other_pool(
    cluster, crashed, left
):
    reference = generate(cluster.router_url, "/v1/completions", BODY)
    assert reference.status == 200
    before = served_alone(cluster, left)
    # The decode fails before its first byte: a stream, which would migrate after it.
    answer = crash_while_it_serves(cluster, crashed, {**BODY, "stream": True})
    assert answer.status == 200 and answer.done and not answer.error_events, answer
    assert answer.text == reference.text
    assert served_alone(cluster, left) - before == 1
