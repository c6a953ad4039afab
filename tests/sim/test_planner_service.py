"""``pdserve planner`` beside a sim cluster: it reads the routers' /metrics, publishes a
plan with its reason (recommend), and in apply mode asks the ratio API for it.

A cluster of its own (1 prefill + 3 decode sims, long prompts): prefill is the bottleneck,
so a planner with a tight TTFT SLO wants more prefill. Slow tier: it re-roles engines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama
from tests.client_load import ClientLoad
from tests.clusters import MODEL
from tests.conditions import wait_for

pytestmark = pytest.mark.slow

PLANNER, PLANNER_OPERATOR, VIEWER = "plan-secret", "plan-op-secret", "viewer-secret"
PROFILE = Path(__file__).resolve().parents[2] / "sim/profiles/tiny-cpu.json"


@pytest.fixture(scope="module")
def pd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    (port,) = free_ports(1)
    tokens = (
        f"planner:planner:{PLANNER},planner-op:operator:{PLANNER_OPERATOR},dash:viewer:{VIEWER}"
    )
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=MODEL, prefill=1, decode=3, port=port,
        run_dir=tmp_path_factory.mktemp("planner-cluster"), ready_timeout_s=60,
        heartbeat_interval_s=0.5, drain_timeout_s=10, engine="sim",
        router_env={"PDSERVE_ADMIN_TOKENS": tokens},
    )  # fmt: skip
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def get(cluster: LocalCluster, path: str, token: str = VIEWER) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(cluster.router_url + path, headers=headers, timeout=10)


def start_planner(
    cluster: LocalCluster, mode: str, token: str, metrics_port: int
) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "cli.main", "planner", "--router", cluster.router_url,
        "--model", MODEL, "--mode", mode, "--slo", "ttft=0.15,itl=1.0",
        "--profile", str(PROFILE), "--interval-s", "2", "--min-change-interval-s", "4",
        "--change-cost-s", "2", "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    return subprocess.Popen(command, env={**os.environ, "PDSERVE_PLANNER_TOKEN": token})


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(timeout=10)


def plan_of(cluster: LocalCluster) -> dict | None:
    return get(cluster, "/admin/v1/plans").json()["plans"].get(MODEL)


def test_recommend_publishes_a_plan_with_its_reason_and_changes_nothing(pd_cluster):
    (metrics_port,) = free_ports(1)
    load = ClientLoad((pd_cluster.router_url,), max_tokens=4, prompt_repeats=300)
    load.start(clients=4)
    planner = start_planner(pd_cluster, "recommend", PLANNER, metrics_port)
    try:
        wait_for(lambda: (plan_of(pd_cluster) or {}).get("prefill", 1) > 1, 90,
                 "a plan for more prefill")  # fmt: skip
        plan = plan_of(pd_cluster)
        assert plan["mode"] == "recommend" and not plan["applied"]
        assert (plan["current_prefill"], plan["current_decode"]) == (1, 3)
        assert plan["prefill"] + plan["decode"] == 4  # local re-roling keeps the total
        assert "1P+3D would meet the SLO for" in plan["reason"]
        assert (
            get(pd_cluster, "/admin/v1/status").json()["plans"][MODEL]["prefill"] == plan["prefill"]
        )
        own = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert (
            f'pdserve_planner_workers{{model="{MODEL}",role="prefill"}} {plan["prefill"]}.0' in own
        )
    finally:
        stop(planner)
        failures = load.finish()
    assert failures == []
    counts = get(pd_cluster, "/admin/v1/pools").json()["models"][MODEL]["counts"]
    assert counts == {"prefill": 1, "decode": 3}  # recommend changes nothing
    audit = get(pd_cluster, "/admin/v1/audit").json()["entries"]
    assert any(e["action"] == "plan:recommend" and e["actor"] == "planner" for e in audit)
    # The planner's scope publishes plans; it cannot change pools.
    refused = httpx.put(pd_cluster.router_url + f"/admin/v1/pools/{MODEL}", timeout=10,
                        headers={"Authorization": f"Bearer {PLANNER}"},
                        json={"prefill": 2, "decode": 2})  # fmt: skip
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"


def test_apply_asks_the_ratio_api_and_the_pools_follow(pd_cluster):
    (metrics_port,) = free_ports(1)
    load = ClientLoad((pd_cluster.router_url,), max_tokens=4, prompt_repeats=300)
    load.start(clients=4)
    planner = start_planner(pd_cluster, "apply", PLANNER_OPERATOR, metrics_port)
    try:
        wait_for(lambda: (plan_of(pd_cluster) or {}).get("applied", False), 90, "an applied plan")

        def pools_match_plan() -> bool:
            pool = get(pd_cluster, "/admin/v1/pools").json()["models"][MODEL]
            plan = plan_of(pd_cluster)
            return pool["counts"] == {"prefill": plan["prefill"], "decode": plan["decode"]}

        wait_for(pools_match_plan, 120, "the pools at the planned split")
    finally:
        stop(planner)
        failures = load.finish()
    assert failures == [], f"{len(failures)} of {len(load.outcomes)} requests failed"
    counts = get(pd_cluster, "/admin/v1/pools").json()["models"][MODEL]["counts"]
    assert counts["prefill"] > 1 and sum(counts.values()) == 4
    audit = get(pd_cluster, "/admin/v1/audit").json()["entries"]
    assert any(e["action"] == "pool_change" and e["actor"] == "planner-op" for e in audit)
    assert any(e["action"] == "plan:apply" for e in audit)
