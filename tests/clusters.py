"""The two shared clusters, as session fixtures any test folder can use (a pytest plugin).

- ``cluster``: real vLLM CPU engines serving the tiny random Llama: router, one
  prefill, one decode, and a colocated reference serving the same weights under its
  own name, so the router offers the model with and without P/D side by side and
  the colocated engine is the single-instance reference P/D output must equal.
- ``sim_cluster``: the same router and agents with simulators in vLLM's place:
  2 prefill + 2 decode + 1 colocated (each test that needs two of a pool uses -0 and -1).
- ``embed_cluster``: a router and two embedding workers (all-MiniLM-L6-v2 on vLLM's
  pooling runner; two, so that a large request is cut across them), apart from
  ``cluster`` so that its tests see no embedding model. Client keys are on: one
  tenant (``METERED_KEY``) has a tokens-per-minute limit, the other
  (``EMBED_OPEN_KEY``) none.

Each starts on first use and stops at the end of the session; every engine
publishes KV events.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import minilm, tiny_llama

MODEL = tiny_llama.SERVED_NAME
METERED_KEY, METERED_TPM = "key-metered", 60
EMBED_OPEN_KEY = "key-open"
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
        ready_timeout_s=600,
        heartbeat_interval_s=1.0,
        drain_timeout_s=5.0,
        # The router's shipped settings (KV lease guard on), probing faster for the tests.
        router_env={"PDSERVE_HEALTH_INTERVAL_S": "1"},
    )
    local = LocalCluster(plan)
    try:
        local.start()  # no warm-up: the tests' first P/D request is a user's first
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def embed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    (port,) = free_ports(1)
    model = minilm.ensure()
    plan = ClusterPlan(
        model_path=model, served_name=minilm.SERVED_NAME, prefill=0, decode=0, embed=2,
        embed_model_path=model, embed_served_name=minilm.SERVED_NAME, port=port,
        run_dir=tmp_path_factory.mktemp("embed_cluster"), ready_timeout_s=600,
        heartbeat_interval_s=1.0, drain_timeout_s=5.0,
        router_env={"PDSERVE_HEALTH_INTERVAL_S": "1", "PDSERVE_TENANTS": json.dumps(
            {"metered": {"keys": [METERED_KEY], "tpm": METERED_TPM},
             "open": {"keys": [EMBED_OPEN_KEY]}})},
    )  # fmt: skip
    local = LocalCluster(plan)
    try:
        local.start()
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


@pytest.fixture(scope="session")
def sim_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(),
        served_name=MODEL,
        colocated_served_name=COLOCATED_MODEL,
        prefill=2,
        decode=2,
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
            "PDSERVE_CIRCUIT_OPEN_S": "3",  # so the circuit test sees a trial in seconds
            "PDSERVE_KV_LEASE_S": "6",
            "PDSERVE_PREFIX_SPECULATIVE_TTL_S": "1",  # the fallback test waits it out
            # The same pool under a second name and policy: policies side by side.
            "PDSERVE_MODEL_ALIASES": f"{MODEL}-rr={MODEL}",
            "PDSERVE_ROUTING_POLICY_BY_MODEL": f"{MODEL}-rr=round_robin",
        },
    )
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def small_sim_cluster(
    run_dir: Path, *, prefill: int = 1, decode: int = 1, **plan: Any
) -> Iterator[LocalCluster]:
    """A sim cluster of one test module's own (quiet, half-second heartbeats), stopped on
    exit; ``plan`` sets any other ``ClusterPlan`` field."""
    (port,) = free_ports(1)
    quick = {"model_path": tiny_llama.ensure(), "ready_timeout_s": 60,
             "heartbeat_interval_s": 0.5, "drain_timeout_s": 2}  # fmt: skip
    local = LocalCluster(
        ClusterPlan(
            served_name=MODEL, prefill=prefill, decode=decode, port=port, run_dir=run_dir,
            engine="sim", **{**quick, **plan},
        ),
        say=lambda _: None,
    )  # fmt: skip
    try:
        local.start()
        yield local
    finally:
        local.stop()
