"""The SRE changes a model's P:D ratio live: workers re-role, and no request is dropped.

A cluster of its own (2 prefill + 2 decode sims), so the shared sim cluster keeps its shape.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama
from tests.client_load import ClientLoad
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import generate

# Slow tier: re-roles restart engines under load (about 40 CPU-seconds, a sixth of the
# fast tier's budget on 2 cores). The targets' storage is in the fast tier (tests/state).
pytestmark = pytest.mark.slow

OPERATOR = "operator-secret"
VIEWER = "viewer-secret"


@pytest.fixture(scope="module")
def pd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=MODEL, prefill=2, decode=2, port=port,
        run_dir=tmp_path_factory.mktemp("ratio-cluster"), ready_timeout_s=60,
        heartbeat_interval_s=0.5, drain_timeout_s=10, engine="sim",
        router_env={"PDSERVE_ADMIN_TOKENS": f"sre:operator:{OPERATOR},dash:viewer:{VIEWER}"},
    )  # fmt: skip
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def admin(cluster: LocalCluster, method: str, path: str, token: str | None = OPERATOR, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, cluster.router_url + path, headers=headers, timeout=10, **kw)


def roles(cluster: LocalCluster) -> dict[str, int]:
    return admin(cluster, "GET", "/admin/v1/pools", VIEWER).json()["models"][MODEL]["counts"]


def change_and_wait(cluster: LocalCluster, prefill: int, decode: int) -> dict:
    answer = admin(
        cluster, "PUT", f"/admin/v1/pools/{MODEL}", json={"prefill": prefill, "decode": decode}
    )
    assert answer.status_code == 202, answer.text
    operation_url = answer.json()["status_url"]
    wait_for(
        lambda: admin(cluster, "GET", operation_url, VIEWER).json()["status"] != "running",
        120,
        f"the change to {prefill}P+{decode}D",
    )
    return admin(cluster, "GET", operation_url, VIEWER).json()


def test_a_ratio_change_under_load_converges_and_drops_nothing(pd_cluster):
    load = ClientLoad((pd_cluster.router_url,), max_tokens=16)
    load.start(clients=4)
    try:
        wait_for(lambda: load.outcomes.count("ok") >= 8, 60, "load flowing before the change")
        there = change_and_wait(pd_cluster, prefill=3, decode=1)
        assert there["status"] == "done", there
        assert roles(pd_cluster) == {"prefill": 3, "decode": 1}
        assert [s["phase"] for s in there["steps"]] == ["done"]
        served_during = len(load.outcomes)
        back = change_and_wait(pd_cluster, prefill=2, decode=2)
        assert back["status"] == "done", back
        assert roles(pd_cluster) == {"prefill": 2, "decode": 2}
        wait_for(lambda: len(load.outcomes) > served_during + 8, 60, "load served after it")
    finally:
        failures = load.finish()
    assert failures == [], f"{len(failures)} of {len(load.outcomes)} requests failed"
    audit = admin(pd_cluster, "GET", "/admin/v1/audit", VIEWER).json()["entries"]
    changes = [(e["actor"], e["outcome"]) for e in audit if e["action"] == "pool_change"]
    assert changes == [("sre", "accepted"), ("sre", "done")] * 2


def test_a_second_change_supersedes_the_first_at_its_step_boundary(pd_cluster):
    path = f"/admin/v1/pools/{MODEL}"
    first = admin(pd_cluster, "PUT", path, json={"prefill": 3, "decode": 1}).json()
    second = admin(pd_cluster, "PUT", path, json={"prefill": 2, "decode": 2}).json()

    def status(operation: dict) -> str:
        return admin(pd_cluster, "GET", operation["status_url"], VIEWER).json()["status"]

    wait_for(lambda: status(second) != "running", 120, "the second change")
    assert (status(first), status(second)) == ("superseded", "done")
    assert roles(pd_cluster) == {"prefill": 2, "decode": 2}
    wait_for(lambda: all(w["state"] == "ready" for w in pool_workers(pd_cluster)), 30,
             "every worker ready after the switch back")  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prefill": 0, "decode": 4}, "prefill"),
        ({"prefill": -1, "decode": 5}, "prefill"),
        ({"prefill": 4, "decode": 4}, "prefill"),  # more workers than the model has
        ({"prefill": "3", "decode": 1}, "prefill"),
        ({"decode": 2}, "prefill"),
        ({"ratio": "three to one"}, "ratio"),
        ({"ratio": "4:0"}, "ratio"),
    ],
)
def test_a_bad_change_is_refused_naming_the_field_and_changes_nothing(pd_cluster, body, param):
    def config() -> tuple:
        pool = admin(pd_cluster, "GET", "/admin/v1/pools", VIEWER).json()["models"][MODEL]
        audit = admin(pd_cluster, "GET", "/admin/v1/audit", VIEWER).json()["entries"]
        accepted = sum(1 for e in audit if e["outcome"] == "accepted")
        return pool["counts"], pool["target"], [w["state"] for w in pool["workers"]], accepted

    before = config()
    answer = admin(pd_cluster, "PUT", f"/admin/v1/pools/{MODEL}", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert config() == before


def test_unknown_models_malformed_bodies_and_missing_scopes_are_refused(pd_cluster):
    path = f"/admin/v1/pools/{MODEL}"
    unknown = admin(pd_cluster, "PUT", "/admin/v1/pools/nope", json={"prefill": 1, "decode": 1})
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (400, "model")
    malformed = admin(pd_cluster, "PUT", path, content=b"{not json")
    assert malformed.status_code == 400
    assert admin(pd_cluster, "PUT", path, token=None, json={}).status_code == 401
    assert admin(pd_cluster, "PUT", path, token="wrong", json={}).status_code == 401
    refused = admin(pd_cluster, "PUT", path, token=VIEWER, json={"prefill": 3, "decode": 1})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "insufficient_scope"
    assert admin(pd_cluster, "GET", "/admin/v1/pools", token=None).status_code == 401
    assert admin(pd_cluster, "GET", "/admin/v1/operations/op-999", VIEWER).status_code == 404


def pool_workers(cluster: LocalCluster) -> list[dict]:
    return admin(cluster, "GET", "/admin/v1/pools", VIEWER).json()["models"][MODEL]["workers"]


def test_a_drained_worker_gets_no_new_work_until_undrained(pd_cluster):
    decode = next(w["worker_id"] for w in pool_workers(pd_cluster) if w["role"] == "decode")
    assert admin(pd_cluster, "POST", f"/admin/v1/workers/{decode}/drain").status_code == 200
    states = {w["worker_id"]: w["state"] for w in pool_workers(pd_cluster)}
    assert states[decode] == "draining"
    eligible = {
        w["worker_id"]: w["eligible"] for w in pd_cluster.admin("GET", "/admin/workers")["workers"]
    }
    assert eligible[decode] is False
    metrics = pd_cluster.router_url + "/metrics"
    routed_before = total(scrape(metrics), "pdserve_routed_requests_total", worker=decode)
    for i in range(6):
        body = {"model": MODEL, "prompt": f"while drained {i}", "max_tokens": 2}
        assert generate(pd_cluster.router_url, "/v1/completions", body).status == 200
    assert total(scrape(metrics), "pdserve_routed_requests_total", worker=decode) == routed_before
    assert admin(pd_cluster, "POST", f"/admin/v1/workers/{decode}/undrain").status_code == 200
    wait_for(lambda: decode in pd_cluster.ready_workers(), 10, "the worker back in rotation")
    assert admin(pd_cluster, "POST", "/admin/v1/workers/nobody/drain").status_code == 404


def test_the_admin_cli_prints_the_pools_and_waits_for_a_change(pd_cluster):
    def pdserve_admin(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", "admin", "--router-url", pd_cluster.router_url,
             "--token", OPERATOR, *argv],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    shown = pdserve_admin("pools")
    assert shown.returncode == 0, shown.stderr
    assert f"{MODEL}: prefill 2/2  decode 2/2" in shown.stdout
    changed = pdserve_admin("ratio", MODEL, "--prefill", "3", "--decode", "1")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "done" in changed.stdout and roles(pd_cluster) == {"prefill": 3, "decode": 1}
    refused = pdserve_admin("ratio", MODEL, "--prefill", "0", "--decode", "4")
    assert refused.returncode != 0 and "prefill must be at least 1" in refused.stderr
    audit = pdserve_admin("audit")
    assert audit.returncode == 0 and "pool_change" in audit.stdout
