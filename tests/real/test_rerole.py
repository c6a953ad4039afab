"""A real vLLM worker changes role (decode -> prefill, and back) through the admin API, and
the disaggregated greedy output is the same before, between and after.

Its own cluster (1 prefill + 2 decode: a ratio never goes below 1 of each), marked
``own_engines`` so it runs before the shared real cluster starts.
"""

from __future__ import annotations

import httpx
import pytest

from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import generate

OPERATOR = "rerole-operator"
HEADERS = {"Authorization": f"Bearer {OPERATOR}"}
PROMPT = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12,
          "temperature": 0, "return_token_ids": True}  # fmt: skip


def change(cluster: LocalCluster, prefill: int, decode: int) -> dict:
    answer = httpx.put(f"{cluster.router_url}/admin/v1/pools/{MODEL}", headers=HEADERS,
                       json={"prefill": prefill, "decode": decode}, timeout=10)  # fmt: skip
    assert answer.status_code == 202, answer.text
    url = cluster.router_url + answer.json()["status_url"]

    def finished() -> bool:
        return httpx.get(url, headers=HEADERS, timeout=10).json()["status"] != "running"

    wait_for(finished, 600, f"re-role to {prefill}P+{decode}D")
    return httpx.get(url, headers=HEADERS, timeout=10).json()


def disaggregated(cluster: LocalCluster) -> list[int]:
    result = generate(cluster.router_url, "/v1/completions", PROMPT)
    assert result.status == 200, result.body
    assert len(result.token_ids) == 12
    return result.token_ids


@pytest.mark.own_engines
def test_a_real_worker_re_roles_and_the_output_stays_the_same(tiny_model, tmp_path):
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_model, served_name=MODEL, prefill=1, decode=2, port=port,
        run_dir=tmp_path / "run", heartbeat_interval_s=1.0, drain_timeout_s=30,
        router_env={"PDSERVE_ADMIN_TOKENS": f"sre:operator:{OPERATOR}"},
    )  # fmt: skip
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        before = disaggregated(cluster)
        for prefill, decode in ((2, 1), (1, 2)):
            operation = change(cluster, prefill, decode)
            assert operation["status"] == "done", operation
            (step,) = operation["steps"]
            seconds = step["finished_unix_s"] - step["started_unix_s"]
            print(f"re-role {step['worker_id']} {step['from']} -> {step['to']}: {seconds:.1f}s")
            counts = httpx.get(f"{cluster.router_url}/admin/v1/pools", headers=HEADERS,
                               timeout=10).json()["models"][MODEL]["counts"]  # fmt: skip
            assert counts == {"prefill": prefill, "decode": decode}
            assert disaggregated(cluster) == before
    finally:
        cluster.stop()
