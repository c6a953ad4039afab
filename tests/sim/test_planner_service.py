"""``pdserve planner`` beside a sim cluster: it reads the routers' /metrics, publishes a
plan with its reason (recommend), and in apply mode asks the ratio API for it.

A cluster of its own (1 prefill + 3 decode sims, long prompts): prefill is the bottleneck,
so a planner with a tight TTFT SLO wants more prefill. Slow tier: it re-roles engines.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localrun.cluster import LocalCluster
from localrun.ports import free_ports
from router.fleet.planner_feed import interval_sample, parse_metrics
from router.fleet.planner_model import Slo
from router.fleet.planner_window import IntervalSample
from tests.client_load import ClientLoad
from tests.clusters import MODEL, small_sim_cluster
from tests.conditions import wait_for

pytestmark = pytest.mark.slow

PLANNER, PLANNER_OPERATOR, VIEWER = "plan-secret", "plan-op-secret", "viewer-secret"
PROFILE = Path(__file__).resolve().parents[2] / "sim/profiles/tiny-cpu.json"


@pytest.fixture(scope="module")
def pd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    tokens = ",".join((f"planner:planner:{PLANNER}", f"planner-op:operator:{PLANNER_OPERATOR}",
                       f"dash:viewer:{VIEWER}"))  # fmt: skip
    env = {"PDSERVE_ADMIN_TOKENS": tokens}
    run_dir = tmp_path_factory.mktemp("planner-cluster")
    with small_sim_cluster(run_dir, prefill=1, decode=3, drain_timeout_s=10, router_env=env) as c:
        yield c


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


@contextlib.contextmanager
def planner_under_load(cluster: LocalCluster, mode: str, token: str) -> Iterator[int]:
    """Long prompts from 4 clients, and a planner beside the cluster (its /metrics port is
    yielded); both stopped on exit, the load's failures asserted to be none."""
    (metrics_port,) = free_ports(1)
    load = ClientLoad((cluster.router_url,), max_tokens=4, prompt_repeats=300)
    load.start(clients=4)
    planner = start_planner(cluster, mode, token, metrics_port)
    try:
        yield metrics_port
    finally:
        stop(planner)
        failures = load.finish()
    assert failures == [], f"{len(failures)} of {len(load.outcomes)} requests failed"


def measured(cluster: LocalCluster) -> IntervalSample:
    text = httpx.get(cluster.router_url + "/metrics", timeout=10).text
    scrapes = (parse_metrics([text], 0.0), parse_metrics([text], 1.0))
    return interval_sample(*scrapes, model=MODEL, slo=Slo(ttft_s=0.15, itl_s=1.0))


def plan_of(cluster: LocalCluster) -> dict | None:
    return get(cluster, "/admin/v1/plans").json()["plans"].get(MODEL)


def test_recommend_publishes_a_plan_with_its_reason_and_changes_nothing(pd_cluster):
    with planner_under_load(pd_cluster, "recommend", PLANNER) as metrics_port:
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
        # What it planned on: the router's measured speeds and pressure, read as it reads them.
        wait_for(lambda: measured(pd_cluster).measured_handoff is not None, 30, "handoff fits")
        sample = measured(pd_cluster)
        assert sample.measured_prefill is not None and sample.measured_prefill[1] > 0
        assert sample.pressure.decode_kv_usage is not None
        own = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert (
            f'pdserve_planner_workers{{model="{MODEL}",role="prefill"}} {plan["prefill"]}.0' in own
        )
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
    with planner_under_load(pd_cluster, "apply", PLANNER_OPERATOR):
        wait_for(lambda: (plan_of(pd_cluster) or {}).get("applied", False), 90, "an applied plan")

        def pools_match_plan() -> bool:
            pool = get(pd_cluster, "/admin/v1/pools").json()["models"][MODEL]
            plan = plan_of(pd_cluster)
            return pool["counts"] == {"prefill": plan["prefill"], "decode": plan["decode"]}

        wait_for(pools_match_plan, 120, "the pools at the planned split")
    counts = get(pd_cluster, "/admin/v1/pools").json()["models"][MODEL]["counts"]
    assert counts["prefill"] > 1 and sum(counts.values()) == 4
    audit = get(pd_cluster, "/admin/v1/audit").json()["entries"]
    assert any(e["action"] == "pool_change" and e["actor"] == "planner-op" for e in audit)
    assert any(e["action"] == "plan:apply" for e in audit)
