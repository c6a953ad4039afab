"""Redis goes away and comes back: the router serves on its last view, refuses config
changes with a clear 503, and converges again when Redis returns (empty: no persistence)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import generate
from tests.redis_server import RedisServer

OPERATOR = "outage-operator"
HEADERS = {"Authorization": f"Bearer {OPERATOR}"}


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, RedisServer]]:
    run_dir = tmp_path_factory.mktemp("outage")
    redis = RedisServer(run_dir)
    redis.start()
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=MODEL, prefill=1, decode=1, port=port,
        run_dir=run_dir, ready_timeout_s=60, heartbeat_interval_s=0.5, drain_timeout_s=5,
        engine="sim",
        router_env={"PDSERVE_STATE_URL": redis.url,
                    "PDSERVE_ADMIN_TOKENS": f"sre:operator:{OPERATOR}"},
    )  # fmt: skip
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        yield cluster, redis
    finally:
        cluster.stop()
        redis.stop()


def change(url: str) -> httpx.Response:
    return httpx.put(f"{url}/admin/v1/pools/{MODEL}", headers=HEADERS,
                     json={"prefill": 1, "decode": 1}, timeout=10)  # fmt: skip


def ask(url: str, i: int) -> int:
    body = {"model": MODEL, "prompt": f"during the outage {i}", "max_tokens": 4}
    return generate(url, "/v1/completions", body, timeout_s=30).status


def test_serving_goes_on_without_redis_and_changes_wait_for_it(outage):
    cluster, redis = outage
    url = cluster.router_url
    assert change(url).status_code == 202
    redis.stop()
    stopped_s, asked = time.monotonic(), 0
    # On past a heartbeat timeout (10 s): the router keeps trusting its own view, which
    # heartbeats still refresh.
    while time.monotonic() < stopped_s + 12:
        assert ask(url, asked) == 200
        asked += 1
    refused = change(url)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "state_unavailable"
    assert "Retry-After" in refused.headers
    drain = httpx.post(f"{url}/admin/v1/workers/prefill-0/drain", headers=HEADERS, timeout=10)
    assert drain.status_code == 503
    assert "prefill-0" in cluster.ready_workers(), "a refused drain must not hold the worker"
    assert httpx.get(f"{url}/admin/v1/pools", headers=HEADERS, timeout=10).status_code == 200

    redis.start()  # empty: no persistence
    wait_for(lambda: change(url).status_code == 202, 30, "config changes accepted again")
    workers = httpx.get(f"{url}/admin/v1/pools", headers=HEADERS, timeout=10).json()
    assert workers["models"][MODEL]["target"] == {"prefill": 1, "decode": 1}
    assert [ask(url, i) for i in range(4)] == [200] * 4
