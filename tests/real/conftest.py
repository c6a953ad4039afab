"""One real cluster per test session: router, prefill, decode and a colocated reference.

Every engine is the vLLM CPU build serving the tiny random Llama. The colocated
worker serves the same weights under its own name, so the router offers the model
with and without P/D side by side, and its engine is the single-instance reference
the disaggregated output must equal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.cluster import CROWDED_BOX_ROUTER_ENV, ClusterPlan, LocalCluster
from cli.ports import free_ports
from modelstore import tiny_llama
from tests.generation import generate

MODEL = tiny_llama.SERVED_NAME
COLOCATED_MODEL = f"{MODEL}-colocated"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return tiny_llama.ensure()


@pytest.fixture(scope="session")
def cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_model,
        served_name=MODEL,
        colocated_served_name=COLOCATED_MODEL,
        prefill=1,
        decode=1,
        colocated=1,
        port=port,
        run_dir=tmp_path_factory.mktemp("cluster"),
        max_model_len=4096,
        ready_timeout_s=400,
        heartbeat_interval_s=1.0,
        drain_timeout_s=5.0,
        router_env={**CROWDED_BOX_ROUTER_ENV, "PDSERVE_HEALTH_INTERVAL_S": "1"},
    )
    local = LocalCluster(plan)
    try:
        local.start()
        _warm_up_disaggregation(local.router_url)
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def router_url(cluster: LocalCluster) -> str:
    return cluster.router_url


@pytest.fixture(scope="session")
def colocated_engine_url(cluster: LocalCluster) -> str:
    return cluster.worker("colocated-0").engine_url


@pytest.fixture(scope="session")
def decode_engine_url(cluster: LocalCluster) -> str:
    return cluster.worker("decode-0").engine_url


def _warm_up_disaggregation(router_url: str, timeout_s: float = 180) -> None:
    """Until one P/D request succeeds. The first pays NIXL's handshake, which on a
    starved 2-core box can fail (decode answers 500); the tests are about what follows."""
    deadline = time.monotonic() + timeout_s
    body = {"model": MODEL, "prompt": "warm up", "max_tokens": 2}
    while generate(router_url, "/v1/completions", body).status != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no P/D request succeeded within {timeout_s:.0f}s")
