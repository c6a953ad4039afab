"""The ratio API acting on Kubernetes: the scaler patches the pools' Deployments' scale
subresource through the official client, within bounds, and the change is done when the
workers the new replicas stand for have registered.

The API server here is a stand-in (tests/kube_api_stand_in.py): it serves the
``deployments/scale`` subresource as the Kubernetes API defines it, over HTTP, and
nothing else. No cluster runs in these tests.
"""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from contracts.workers import WorkerRole
from router.errors import InvalidRequest
from router.fleet.kubernetes_scaler import KubernetesScaler, apps_api
from router.fleet.pool_operations import Operation
from router.settings import ControlSettings
from router.state.base import PoolTargets
from tests.kube_api_stand_in import kube_api
from tests.router.conftest import TEST_ROUTER, running_router

MODEL = "m"
DEPLOYMENTS = f"{MODEL}/prefill=pdserve-prefill,{MODEL}/decode=pdserve-decode"
PREFILL, DECODE = WorkerRole.PREFILL, WorkerRole.DECODE


def settings(**overrides) -> ControlSettings:
    return ControlSettings(scaler="kubernetes", scaler_namespace="pdserve",
                           scaler_deployments=DEPLOYMENTS, scaler_max_replicas=4,
                           **overrides)  # fmt: skip


def operation(prefill: int, decode: int) -> Operation:
    return Operation("op-1", MODEL, PoolTargets(prefill, decode), "sre", time.time())


@pytest.fixture
def kubeconfig_of(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def point_at(api):
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
        return apps_api()

    return point_at


async def nothing() -> None:
    pass


def test_a_change_scales_the_growing_pool_first_and_ends_when_its_workers_register(
    kubeconfig_of,
):
    ready = {PREFILL: 1, DECODE: 2}  # what the router has registered
    with kube_api({"pdserve-prefill": 1, "pdserve-decode": 2}) as api:
        # The stand-in's Deployment controller: the pods come up and register.
        api.on_scale = lambda name, n: ready.update({PREFILL if "prefill" in name else DECODE: n})
        scaler = KubernetesScaler(settings(), ready_counts=lambda model: dict(ready),
                                  wall_clock=time.time, api=kubeconfig_of(api))  # fmt: skip
        change = operation(3, 1)
        asyncio.run(scaler.converge(change, nothing))

    assert change.status == "done", change.detail
    assert api.patches == [("pdserve-prefill", 3), ("pdserve-decode", 1)]
    assert [s.as_dict()["deployment"] for s in change.steps] == ["pdserve-prefill",
                                                                   "pdserve-decode"]  # fmt: skip
    assert [(s.from_replicas, s.to_replicas, s.phase) for s in change.steps] == [
        (1, 3, "done"), (2, 1, "done")]  # fmt: skip


def test_targets_outside_the_bounds_or_without_a_deployment_are_refused(kubeconfig_of):
    with kube_api({"pdserve-prefill": 1, "pdserve-decode": 1}) as api:
        scaler = KubernetesScaler(settings(scaler_min_replicas=1), ready_counts=lambda m: {},
                                  wall_clock=time.time, api=kubeconfig_of(api))  # fmt: skip
        counts = {PREFILL: 1, DECODE: 1}
        assert scaler.refusal(MODEL, PoolTargets(4, 1), counts) is None  # any total
        too_many = scaler.refusal(MODEL, PoolTargets(5, 1), counts)
        assert isinstance(too_many, InvalidRequest) and too_many.param == "prefill"
        assert "1..4" in str(too_many)
        unnamed = scaler.refusal("other", PoolTargets(1, 1), counts)
        assert isinstance(unnamed, InvalidRequest) and "scaler_deployments" in str(unnamed)
    assert api.patches == []


def test_a_forbidden_scale_fails_the_change_with_the_api_servers_answer(kubeconfig_of):
    with kube_api({"pdserve-prefill": 1, "pdserve-decode": 1}) as api:
        api.forbidden = {"pdserve-decode"}
        scaler = KubernetesScaler(settings(), ready_counts=lambda m: {PREFILL: 1, DECODE: 1},
                                  wall_clock=time.time, api=kubeconfig_of(api))  # fmt: skip
        change = operation(1, 2)
        asyncio.run(scaler.converge(change, nothing))
    assert change.status == "failed" and "403" in change.detail
    assert api.patches == []


def test_pods_that_never_register_fail_the_change_at_the_timeout(kubeconfig_of):
    with kube_api({"pdserve-prefill": 1, "pdserve-decode": 1}) as api:
        scaler = KubernetesScaler(settings(scale_timeout_s=1.5),
                                  ready_counts=lambda m: {PREFILL: 1, DECODE: 1},
                                  wall_clock=time.time, api=kubeconfig_of(api))  # fmt: skip
        change = operation(2, 1)
        asyncio.run(scaler.converge(change, nothing))
    assert change.status == "failed" and "did not reach" in change.detail
    assert api.patches == [("pdserve-prefill", 2)]
    assert change.steps[0].phase == "timed_out"


def register_ready(router, worker_id: str, role: str) -> None:
    router.register(worker_id, role, MODEL, "http://127.0.0.1:9")
    beat = {"worker_id": worker_id, "ready": True}
    assert router.agent("POST", "/admin/workers/heartbeat", beat).status_code == 200


def test_the_ratio_api_of_a_router_scales_deployments_through_the_stand_in(tmp_path):
    with kube_api({"pdserve-prefill": 1, "pdserve-decode": 1}) as api:
        env = {**TEST_ROUTER, "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")),
               "PDSERVE_SCALER": "kubernetes", "PDSERVE_SCALER_NAMESPACE": "pdserve",
               "PDSERVE_SCALER_DEPLOYMENTS": DEPLOYMENTS, "PDSERVE_SCALER_MAX_REPLICAS": "3",
               "PATH": os.environ["PATH"]}  # fmt: skip
        with running_router(**env) as router:
            register_ready(router, "prefill-a", "prefill")
            register_ready(router, "decode-a", "decode")
            refused = router.admin("PUT", f"/admin/v1/pools/{MODEL}", {"prefill": 4, "decode": 1})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "prefill"

            accepted = router.admin("PUT", f"/admin/v1/pools/{MODEL}", {"prefill": 2, "decode": 1})
            assert accepted.status_code == 202, accepted.text
            status_path = accepted.json()["status_url"]
            deadline = time.monotonic() + 10
            while api.patches != [("pdserve-prefill", 2)] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert api.patches == [("pdserve-prefill", 2)]
            assert router.admin("GET", status_path).json()["status"] == "running"

            register_ready(router, "prefill-b", "prefill")  # the new pod, loaded
            deadline = time.monotonic() + 10
            while router.admin("GET", status_path).json()["status"] == "running":
                assert time.monotonic() < deadline, "the change never finished"
                time.sleep(0.1)
            done = router.admin("GET", status_path).json()
    assert done["status"] == "done", done
    assert [(s["deployment"], s["from_replicas"], s["to_replicas"]) for s in done["steps"]] == [
        ("pdserve-prefill", 1, 2), ("pdserve-decode", 1, 1)]  # fmt: skip
    assert httpx.URL(api.url).host == "127.0.0.1"
