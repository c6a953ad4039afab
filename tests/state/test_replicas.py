"""Two router replicas on one real redis-server, in front of one sim cluster.

Agents report to replica A and fail over to B; B knows the workers only through the
shared state. Tests run in file order: the last one kills A.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from agent import process_group
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from localrun.redis_server import RedisServer
from modelstore import tiny_llama
from modelstore.checksum import folder_checksum
from tests.client_load import ClientLoad
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import generate

# Slow tier: two routers, Redis and a 2P+2D cluster, killed and restarted (about 30
# CPU-seconds). The shared state itself is in the fast tier (test_state_suite, test_state_sync).
pytestmark = pytest.mark.slow

OPERATOR = "replica-operator"
HEADERS = {"Authorization": f"Bearer {OPERATOR}"}
HEARTBEAT_TIMEOUT_S = 3  # short, so tests can outlast it in seconds


@dataclass
class Replicas:
    cluster: LocalCluster
    redis: RedisServer
    a: str
    b: str


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    run_dir = tmp_path_factory.mktemp("replicas")
    redis = RedisServer(run_dir)
    redis.start()
    try:
        port_a, port_b = free_ports(2)
        url_b = f"http://127.0.0.1:{port_b}"
        env = {
            "PDSERVE_STATE_URL": redis.url,
            "PDSERVE_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
            "PDSERVE_ADMIN_TOKENS": f"sre:operator:{OPERATOR}",
        }
        plan = ClusterPlan(
            model_path=tiny_llama.ensure(), served_name=MODEL, prefill=2, decode=2,
            port=port_a, run_dir=run_dir, ready_timeout_s=60, heartbeat_interval_s=0.5,
            drain_timeout_s=10, engine="sim", router_env=env, extra_router_urls=(url_b,),
            model_version="v1",
        )  # fmt: skip
        cluster = LocalCluster(plan)
        router_b = cluster.start_replica(url_b)
        try:
            cluster.start()
            yield Replicas(cluster, redis, cluster.router_url, url_b)
        finally:
            cluster.stop()
            process_group.stop([router_b], grace_s=15)
    finally:
        redis.stop()


def pools(url: str) -> dict:
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    return httpx.get(url + "/admin/v1/pools", headers=headers, timeout=10).json()["models"]


def ready_counts(url: str) -> dict[str, int]:
    workers = pools(url).get(MODEL, {}).get("workers", [])
    counts = {"prefill": 0, "decode": 0}
    for w in workers:
        counts[w["role"]] += w["state"] == "ready"
    return counts


def ask(url: str, i: int) -> int:
    body = {"model": MODEL, "prompt": f"replica request {i}", "max_tokens": 4}
    return generate(url, "/v1/completions", body, timeout_s=30).status


def test_a_second_replica_serves_the_workers_it_learned_from_the_state(replicas):
    wait_for(lambda: ready_counts(replicas.b) == {"prefill": 2, "decode": 2}, 20,
             "replica B to see all four workers ready")  # fmt: skip
    assert [ask(replicas.b, i) for i in range(6)] == [200] * 6


def test_a_ratio_change_through_one_replica_is_enforced_by_both(replicas):
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    for prefill, decode in ((3, 1), (2, 2)):
        answer = httpx.put(f"{replicas.a}/admin/v1/pools/{MODEL}", headers=headers,
                           json={"prefill": prefill, "decode": decode}, timeout=10)  # fmt: skip
        assert answer.status_code == 202, answer.text
        status_url = replicas.a + answer.json()["status_url"]
        wait_for(lambda s=status_url: httpx.get(s, headers=headers).json()["status"] == "done",
                 60, f"the change to {prefill}P+{decode}D")  # fmt: skip
        on_b = httpx.get(replicas.b + answer.json()["status_url"], headers=headers).json()
        assert on_b["status"] == "done" and on_b["id"] == answer.json()["operation"]
        want = {"prefill": prefill, "decode": decode}
        for url in (replicas.a, replicas.b):
            wait_for(lambda u=url, w=want: ready_counts(u) == w, 10, f"{url} to serve {want}")
            assert pools(url)[MODEL]["target"] == want
        assert [ask(replicas.b, i) for i in range(4)] == [200] * 4


def test_the_registry_and_a_route_set_through_one_replica_rule_both(replicas):
    folder = str(tiny_llama.ensure())
    artifact = {"model_id": MODEL, "version": "v1", "artifact": folder, "max_context": 4096,
                "tokenizer": folder, "checksum": folder_checksum(Path(folder))}  # fmt: skip
    assert httpx.post(f"{replicas.a}/admin/v1/models", json=artifact, headers=HEADERS,
                      timeout=10).status_code == 201  # fmt: skip
    route = {"prod": "v1"}
    policy = {"safety": {"checks": [{"name": "no", "blocklist": ["forbidden"]}]}}
    # Both replicas write at once: compare-and-set keeps one whole document, and both agree.
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(
            lambda change: httpx.put(change[0], json=change[1], headers=HEADERS, timeout=10),
            [(f"{url}/admin/v1/{kind}/{MODEL}", body) for url in (replicas.a, replicas.b)
             for kind, body in (("routes", route), ("policies", policy))],
        ))  # fmt: skip
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]

    def route_on(url: str) -> dict:
        answer = httpx.get(f"{url}/admin/v1/routes/{MODEL}", headers=HEADERS, timeout=10)
        return answer.json() if answer.status_code == 200 else {}

    def checks_on(url: str) -> list:
        answer = httpx.get(f"{url}/admin/v1/policies/{MODEL}", headers=HEADERS, timeout=10)
        return answer.json()["policy"]["safety"]["checks"]

    wait_for(lambda: route_on(replicas.b).get("spec") == route_on(replicas.a).get("spec")
             and route_on(replicas.b) and checks_on(replicas.b), 10,
             "replica B to follow the route and the policy")  # fmt: skip
    body = {"model": MODEL, "prompt": "say the forbidden word", "max_tokens": 2}
    refused = httpx.post(f"{replicas.b}/v1/completions", json=body, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == (
        "content_policy_violation")  # fmt: skip
    assert [ask(replicas.b, i) for i in range(4)] == [200] * 4  # prod v1: every worker
    audit = httpx.get(f"{replicas.b}/admin/v1/audit?limit=20", headers=HEADERS).json()
    assert sum(e["action"] == "set_route" and e["outcome"] == "ok"
               for e in audit["entries"]) == 2  # fmt: skip


def change_to_two_and_two(url: str) -> httpx.Response:
    return httpx.put(f"{url}/admin/v1/pools/{MODEL}", headers=HEADERS,
                     json={"prefill": 2, "decode": 2}, timeout=10)  # fmt: skip


def test_without_redis_serving_goes_on_and_changes_wait_for_it(replicas):
    """Redis goes away and comes back empty (no persistence): the routers serve on their
    last view, refuse config changes with a clear 503, and converge when it returns."""
    url = replicas.a
    replicas.redis.stop()
    stopped_s, asked = time.monotonic(), 0
    # On past a heartbeat timeout: each router keeps trusting its own view, which the
    # heartbeats it receives still refresh.
    while time.monotonic() < stopped_s + HEARTBEAT_TIMEOUT_S + 2:
        assert ask(url, asked) == 200
        asked += 1
    refused = change_to_two_and_two(url)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "state_unavailable"
    assert "Retry-After" in refused.headers
    drain = httpx.post(f"{url}/admin/v1/workers/prefill-0/drain", headers=HEADERS, timeout=10)
    assert drain.status_code == 503
    assert "prefill-0" in replicas.cluster.ready_workers(), "a refused drain must not hold"
    assert httpx.get(f"{url}/admin/v1/pools", headers=HEADERS, timeout=10).status_code == 200

    replicas.redis.start()  # empty
    wait_for(lambda: change_to_two_and_two(url).status_code == 202, 30, "changes accepted")
    for replica in (replicas.a, replicas.b):
        wait_for(lambda r=replica: ready_counts(r) == {"prefill": 2, "decode": 2}, 20,
                 f"{replica} to see every worker again")  # fmt: skip
        assert pools(replica)[MODEL]["target"] == {"prefill": 2, "decode": 2}
        assert [ask(replica, i) for i in range(3)] == [200] * 3


def test_a_replica_started_under_load_knows_the_fleet_from_its_first_answer(replicas):
    """It reads the shared state before it takes requests: its first answer is a 200,
    not a 404 for a model its follower has yet to learn (a restart under load)."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    replica = replicas.cluster.start_replica(url, wait=False)
    body = {"model": MODEL, "prompt": "first", "max_tokens": 2}
    deadline, status = time.monotonic() + 60, None
    try:
        with httpx.Client(timeout=30) as client:
            while status is None and time.monotonic() < deadline:
                try:  # at once, as clients of a restarted replica do: no polling gap
                    status = client.post(url + "/v1/completions", json=body).status_code
                except httpx.TransportError:  # not listening yet
                    time.sleep(0.001)
    finally:
        process_group.stop([replica], grace_s=15)
    assert status == 200


def test_killing_a_replica_under_load_loses_nothing(replicas):
    clients = ClientLoad((replicas.a, replicas.b))
    clients.start(clients=3)
    try:
        wait_for(lambda: clients.outcomes.count("ok") >= 10, 30, "load flowing through A")
        process_group.signal_group(replicas.cluster.router.pid, signal.SIGKILL)
        replicas.cluster.router.wait(timeout=10)
        killed_s, served = time.monotonic(), len(clients.outcomes)
        # Load goes on past the heartbeat timeout: B keeps the workers only if the agents
        # now report to it.
        wait_for(
            lambda: time.monotonic() > killed_s + HEARTBEAT_TIMEOUT_S + 2
            and len(clients.outcomes) >= served + 20,
            60, "load served by B past a heartbeat timeout",
        )  # fmt: skip
    finally:
        failures = clients.finish()
    assert failures == [], f"{len(failures)} of {len(clients.outcomes)} failed"
    assert clients.retried > 0, "no request went to B: A was not under load when killed"
    assert ready_counts(replicas.b) == {"prefill": 2, "decode": 2}
