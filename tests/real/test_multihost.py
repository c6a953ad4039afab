"""P/D across hosts: redis-server, the router, a prefill agent, a decode agent and a second
router replica, each in a network namespace of its own (``tests/netns.py``), on real vLLM;
with a colocated engine on a host of its own as the reference output. Marked
``own_engines``: it runs before the shared real cluster starts.

Every process binds its own host's address and is told its peers' addresses; nothing
crosses loopback. The prompt's KV blocks move over NIXL/UCX on the veths (counted on
the decode host's interface), KV events reach both routers, and the routers share the
fleet through redis-server on its own host.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import process_group
from loadgen.prometheus_text import scrape, total
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from localrun.redis_server import RedisServer
from tests import netns
from tests.clusters import COLOCATED_MODEL, MODEL
from tests.conditions import wait_for
from tests.generation import generate

pytestmark = [
    pytest.mark.own_engines,
    pytest.mark.skipif(netns.available() is not None, reason=str(netns.available())),
]

HOSTS = ("redis", "router", "prefill", "decode", "replica", "reference")
GREEDY = {"temperature": 0, "max_tokens": 16, "ignore_eos": True, "return_token_ids": True}
# UCX's TCP listening ports, as deploy/k8s pins them for its NetworkPolicy (per namespace:
# no clash with the box's own ports).
UCX_TCP_PORTS = (47000, 47099)


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[netns.Fleet]:
    run_dir = tmp_path_factory.mktemp("multihost")
    with netns.network(HOSTS) as net:
        hosts = net.hosts
        redis = RedisServer(run_dir, hosts["redis"])
        redis.start()
        port, replica_port = free_ports(2)
        replica_url = hosts["replica"].url(replica_port)
        plan = ClusterPlan(
            model_path=tiny_model, served_name=MODEL, colocated_served_name=COLOCATED_MODEL,
            prefill=1, decode=1, colocated=1, port=port,
            run_dir=run_dir, max_model_len=4096, heartbeat_interval_s=1.0, drain_timeout_s=5.0,
            hosts={"router": hosts["router"], "prefill-0": hosts["prefill"],
                   "decode-0": hosts["decode"], "colocated-0": hosts["reference"]},
            extra_router_urls=(replica_url,),
            router_env={"PDSERVE_HEALTH_INTERVAL_S": "1", "PDSERVE_STATE_URL": redis.url,
                        "PDSERVE_ALLOWED_WORKER_NETWORKS": str(net.subnet)},
        )  # fmt: skip
        cluster = LocalCluster(plan)
        replica = None
        with pytest.MonkeyPatch.context() as env:
            env.setenv("UCX_TCP_PORT_RANGE", "-".join(map(str, UCX_TCP_PORTS)))
            try:
                cluster.start()
                replica = cluster.start_replica(replica_url, host=hosts["replica"])
                yield netns.Fleet(net, cluster, replica_url)
            finally:
                cluster.stop()
                if replica is not None:
                    process_group.stop([replica], grace_s=15)
                redis.stop()


def test_every_process_listens_on_its_own_host_address_only(fleet: netns.Fleet):
    for name in fleet.net.hosts:
        listening = fleet.net.listeners(name)
        print(f"{name}: {' '.join(sorted(listening))}")
        assert listening, f"nothing listens on {name}"
        assert fleet.net.strays(name) == [], name


def test_a_pd_worker_listens_only_on_the_ports_its_network_policy_opens(fleet: netns.Fleet):
    """deploy/k8s opens a P/D worker's engine, KV event and NIXL side channel ports and
    UCX's TCP range (``UCX_TCP_PORT_RANGE``) to its peers: nothing else may listen on
    its address, or the policy would cut it off."""
    for host, worker in (("prefill", "prefill-0"), ("decode", "decode-0")):
        plan = fleet.cluster.worker(worker)
        named = {plan.engine_port, plan.kv_events_port, plan.side_channel_port}
        address = fleet.net.hosts[host].address
        ports = {int(local.rsplit(":", 1)[1]) for local in fleet.net.listeners(host)
                 if local.rsplit(":", 1)[0] == address}  # fmt: skip
        assert named <= ports, (worker, sorted(ports))
        low, high = UCX_TCP_PORTS
        assert {p for p in ports - named if not low <= p <= high} == set(), (worker, ports)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_greedy_output_across_hosts_equals_colocated(fleet: netns.Fleet, stream):
    body = {"prompt": "import os\nimport sys\n\nclass Reader:\n", **GREEDY, "stream": stream}
    reference = generate(
        fleet.engine_url("colocated-0"), "/v1/completions", {**body, "model": COLOCATED_MODEL}
    )
    routed = generate(fleet.router_url, "/v1/completions", {**body, "model": MODEL})

    assert reference.status == 200 and routed.status == 200, routed.body
    assert routed.token_ids == reference.token_ids
    assert routed.text == reference.text


def test_the_prompts_kv_crosses_the_decode_hosts_wire(fleet: netns.Fleet, tiny_model: Path):
    def by_source(source: str) -> float:
        samples = scrape(fleet.engine_url("decode-0") + "/metrics")
        return total(samples, "vllm:prompt_tokens_by_source_total", source=source)

    before = {s: by_source(s) for s in ("external_kv_transfer", "local_compute")}
    wire_before = fleet.net.counters("decode")["rx_bytes"]
    prompt = "a fresh prompt for the wire check: " + "tokens " * 600
    result = generate(fleet.router_url, "/v1/completions",
                      {"model": MODEL, "prompt": prompt, "max_tokens": 2})  # fmt: skip
    assert result.status == 200, result.body
    prompt_tokens = result.usage["prompt_tokens"]

    assert by_source("external_kv_transfer") - before["external_kv_transfer"] == prompt_tokens
    assert by_source("local_compute") - before["local_compute"] == 0
    # The blocks came in on the decode host's veth, not through shared memory: at least
    # the prompt's KV (2-byte elements, the smallest dtype an engine here may choose).
    received = fleet.net.counters("decode")["rx_bytes"] - wire_before
    assert received >= prompt_tokens * _kv_bytes_per_token(tiny_model, element_bytes=2)


def test_kv_events_reach_both_routers_across_hosts(fleet: netns.Fleet):
    prompt = "a prompt whose blocks the routers should learn of: " + "words " * 300
    result = generate(fleet.router_url, "/v1/completions",
                      {"model": MODEL, "prompt": prompt, "max_tokens": 1})  # fmt: skip
    assert result.status == 200, result.body
    for url in (fleet.router_url, fleet.replica_url):
        wait_for(
            lambda url=url: total(scrape(url + "/metrics"), "pdserve_prefix_index_worker_blocks",
                                  worker="prefill-0") > 0,
            timeout_s=30, what=f"prefill-0's blocks indexed by {url}",
        )  # fmt: skip


def test_the_replica_on_a_fourth_host_serves_the_same_fleet(fleet: netns.Fleet):
    workers = fleet.cluster.admin("GET", "/admin/workers")["workers"]
    assert {w["worker_id"]: w["eligible"] for w in workers} == {
        "prefill-0": True,
        "decode-0": True,
        "colocated-0": True,
    }
    body = {"model": MODEL, "prompt": "def fibonacci(n):", **GREEDY}
    first = generate(fleet.router_url, "/v1/completions", body)
    second = generate(fleet.replica_url, "/v1/completions", body)
    assert first.status == 200 and second.status == 200, second.body
    assert second.token_ids == first.token_ids


def _kv_bytes_per_token(model: Path, element_bytes: int) -> int:
    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    return config["num_hidden_layers"] * 2 * kv_heads * head_dim * element_bytes
