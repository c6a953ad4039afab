"""A canary's pre-pull on a sim cluster whose workers run from a pull cache (as pods'
init containers leave it): the route asks for the canary's version on N workers; the
chosen agents pull it beside the version they serve, verified, while serving; the canary
gets no traffic until N workers report it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster
from modelstore import tiny_llama
from modelstore.checksum import folder_checksum
from modelstore.pull import pull
from tests.clusters import MODEL, small_sim_cluster
from tests.conditions import wait_for
from tests.generation import generate

VERSIONS = {"v1": tiny_llama.ensure(), "v2": tiny_llama.ensure(seed=1)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pull-cache")


@pytest.fixture(scope="module")
def cluster(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    v1 = VERSIONS["v1"]
    pull(str(v1), model=MODEL, version="v1", checksum=folder_checksum(v1), cache=cache,
         progress=lambda _: None)  # the pods' init container  # fmt: skip
    run_dir = tmp_path_factory.mktemp("prepull")
    with small_sim_cluster(run_dir, model_path=cache / MODEL / "v1", model_version="v1") as local:
        for version, folder in VERSIONS.items():
            local.admin("POST", "/admin/v1/models", {
                "model_id": MODEL, "version": version, "artifact": str(folder),
                "max_context": 4096, "tokenizer": str(folder),
                "checksum": folder_checksum(folder),
            })  # fmt: skip
        yield local


def route(cluster: LocalCluster, prepull_workers: int) -> dict:
    canary = {"version": "v2", "weight": 1.0, "prepull_workers": prepull_workers}
    return cluster.admin("PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v1", "canary": canary})


def prepull(cluster: LocalCluster) -> dict:
    return cluster.admin("GET", f"/admin/v1/routes/{MODEL}")["prepull"]


def canary_requests(cluster: LocalCluster) -> float:
    samples = scrape(cluster.router_url + "/metrics")
    return total(samples, "pdserve_requests_total", route_stage="canary")


def ask(cluster: LocalCluster):
    return generate(cluster.router_url, "/v1/completions",
                    {"model": MODEL, "prompt": "pre-pull", "max_tokens": 2})  # fmt: skip


def test_the_canary_waits_until_its_version_is_pulled_on_enough_workers(cluster, cache):
    # Three asked of two workers: both pull, and the gate stays shut.
    assert route(cluster, prepull_workers=3)["prepull"]["open"] is False
    wait_for(lambda: prepull(cluster)["pulled"] == 2, 30, "both workers to pull v2")
    assert prepull(cluster) == {"version": "v2", "workers": 3, "pulled": 2, "open": False}
    assert folder_checksum(cache / MODEL / "v2") == folder_checksum(VERSIONS["v2"])
    before = canary_requests(cluster)
    assert [ask(cluster).status for _ in range(4)] == [200] * 4  # all on prod (v1)
    assert canary_requests(cluster) == before
    assert sorted(cluster.ready_workers()) == ["decode-0", "prefill-0"]  # served throughout

    # Two are enough: the gate opens and the canary takes its keys (weight 1: all). No
    # worker serves v2 yet, so they are refused as having none, not sent to v1.
    assert route(cluster, prepull_workers=2)["prepull"]["open"] is True
    refused = ask(cluster)
    assert refused.status == 503 and refused.body["error"]["code"] == "no_ready_worker"
    assert canary_requests(cluster) == before + 1
