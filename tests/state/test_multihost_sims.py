"""The control plane across hosts: redis-server, two router replicas, a prefill and two
decode agents (simulated engines), each in a network namespace of its own
(``tests/netns.py``). Heartbeats cross from the agents' hosts to the router's, the
ratio API re-roles a worker on another host, and the replica on a fourth host learns all
of it through redis-server on a fifth. The KV transfer itself across hosts is real
vLLM's (``tests/real/test_multihost.py``); the simulators have no NIXL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from agent import process_group
from localrun.ports import free_ports
from localrun.redis_server import RedisServer
from tests import netns
from tests.clusters import MODEL, small_sim_cluster
from tests.conditions import wait_for
from tests.generation import generate

# Slow tier: six namespaces, two routers and three agents (about 20 CPU-seconds).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(netns.available() is not None, reason=str(netns.available())),
]

OPERATOR = "multihost-operator"
HEADERS = {"Authorization": f"Bearer {OPERATOR}"}
HEARTBEAT_TIMEOUT_S = 3
HOSTS = ("redis", "router", "replica", "prefill-0", "decode-0", "decode-1")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[netns.Fleet]:
    run_dir = tmp_path_factory.mktemp("multihost-sims")
    with netns.network(HOSTS) as net:
        redis = RedisServer(run_dir, net.hosts["redis"])
        redis.start()
        (replica_port,) = free_ports(1)
        replica_url = net.hosts["replica"].url(replica_port)
        replica = None
        env = {
            "PDSERVE_STATE_URL": redis.url,
            "PDSERVE_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
            "PDSERVE_ADMIN_TOKENS": f"sre:operator:{OPERATOR}",
            "PDSERVE_ALLOWED_WORKER_NETWORKS": str(net.subnet),
        }
        try:
            with small_sim_cluster(
                run_dir, prefill=1, decode=2, router_env=env, extra_router_urls=(replica_url,),
                hosts={name: net.hosts[name] for name in HOSTS[1:] if name != "replica"},
            ) as cluster:  # fmt: skip
                replica = cluster.start_replica(replica_url, host=net.hosts["replica"])
                yield netns.Fleet(net, cluster, replica_url)
                process_group.stop([replica], grace_s=15)
                replica = None
        finally:
            if replica is not None:
                process_group.stop([replica], grace_s=15)
            redis.stop()


def pools(url: str) -> dict:
    return httpx.get(url + "/admin/v1/pools", headers=HEADERS, timeout=10).json()["models"][MODEL]


def ready_roles(url: str) -> dict[str, str]:
    return {w["worker_id"]: w["role"] for w in pools(url)["workers"] if w["state"] == "ready"}


def served(url: str) -> int:
    body = {"model": MODEL, "prompt": "across hosts", "max_tokens": 4}
    return generate(url, "/v1/completions", body, timeout_s=30).status


def test_every_process_listens_on_its_own_host_address_only(fleet: netns.Fleet):
    for name in fleet.net.hosts:
        assert fleet.net.listeners(name), f"nothing listens on {name}"
        assert fleet.net.strays(name) == [], name


def test_heartbeats_cross_hosts_and_keep_every_worker_ready_past_the_timeout(fleet: netns.Fleet):
    want = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
    for url in fleet.routers:
        wait_for(lambda u=url: ready_roles(u) == want, 30, f"{url} to see the fleet ready")
    # Three heartbeat timeouts later, still ready on both: the heartbeats keep arriving.
    until = time.monotonic() + 3 * HEARTBEAT_TIMEOUT_S
    while time.monotonic() < until:
        seen = {w["worker_id"]: w["seen_s_ago"] for w in fleet.cluster.worker_status().values()}
        assert set(seen) == set(want) and max(seen.values()) < HEARTBEAT_TIMEOUT_S, seen
        time.sleep(0.5)
    for url in fleet.routers:
        assert ready_roles(url) == want
        assert [served(url) for _ in range(3)] == [200] * 3


def test_a_ratio_change_re_roles_a_worker_on_another_host_and_both_routers_follow(
    fleet: netns.Fleet,
):
    for prefill, decode in ((2, 1), (1, 2)):
        answer = httpx.put(f"{fleet.cluster.router_url}/admin/v1/pools/{MODEL}",
                           headers=HEADERS, json={"prefill": prefill, "decode": decode},
                           timeout=10)  # fmt: skip
        assert answer.status_code == 202, answer.text
        status_path = answer.json()["status_url"]

        def done(url: str = fleet.replica_url, status_path: str = status_path) -> bool:
            # Read through the replica: the operation is in the shared state.
            operation = httpx.get(url + status_path, headers=HEADERS, timeout=10).json()
            assert operation["status"] in ("running", "done"), operation
            return operation["status"] == "done"

        wait_for(done, 60, f"the change to {prefill}P+{decode}D")
        want = {"prefill": prefill, "decode": decode}
        for url in fleet.routers:
            wait_for(lambda u=url, w=want: _counted(ready_roles(u)) == w, 20, f"{url} at {want}")
            assert pools(url)["target"] == want
            assert [served(url) for _ in range(3)] == [200] * 3


def _counted(roles: dict[str, str]) -> dict[str, int]:
    return {role: list(roles.values()).count(role) for role in ("prefill", "decode")}
