"""A whole cluster on simulated engines: the real router and agents, sims in vLLM's place."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.cluster import ClusterPlan, LocalCluster
from cli.ports import free_ports
from modelstore import tiny_llama

MODEL = tiny_llama.SERVED_NAME
COLOCATED_MODEL = f"{MODEL}-colocated"


@pytest.fixture(scope="session")
def sim_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(),
        served_name=MODEL,
        colocated_served_name=COLOCATED_MODEL,
        prefill=2,
        decode=4,
        colocated=1,
        port=port,
        run_dir=tmp_path_factory.mktemp("sim-cluster"),
        ready_timeout_s=60,
        heartbeat_interval_s=0.5,
        drain_timeout_s=2,
        engine="sim",
        kv_lease_s=6,  # the shortest NixlConnector allows: the lease test waits it out
        router_env={
            "PDSERVE_HEALTH_INTERVAL_S": "0.5",
            "PDSERVE_HEALTH_TIMEOUT_S": "1",  # so the hang test ejects in seconds
            "PDSERVE_KV_LEASE_S": "6",
        },
    )
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
