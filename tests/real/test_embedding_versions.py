"""Two versions of an embedding model on real vLLM: all-MiniLM-L6-v2 (v1) and a variant
with nudged token embeddings (v2, ``minilm.ensure_variant``). Registered with their
checksums, routed prod and canary by user, then promoted: the registry, routes and
stages apply to an embedding model as to a generative one.

Its own cluster (one embedding engine per version), marked ``own_engines`` so it runs
before the shared real clusters start.
"""

from __future__ import annotations

import httpx
import pytest

from localrun.cluster import ClusterPlan, LocalCluster, VersionWorkers
from localrun.ports import free_ports
from modelstore import minilm
from modelstore.checksum import folder_checksum
from tests.embedding_vectors import cosine, vectors
from tests.route_walk import ROUTER_ENV, register, walk_route

MODEL = "minilm-versions"
TEXTS = ["The capital of France is Paris.", "Disaggregated serving moves KV blocks."]


def embed(url: str, user: str | None = None) -> list:
    body = {"model": MODEL, "input": TEXTS, **({"user": user} if user else {})}
    answer = httpx.post(url + "/v1/embeddings", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return vectors(answer.json())


def same(ours: list, theirs: list) -> bool:
    return all(cosine(a, b) >= 0.9999 for a, b in zip(ours, theirs, strict=True))


@pytest.mark.own_engines
def test_embedding_versions_follow_the_route(tmp_path):
    paths = {"v1": minilm.ensure(), "v2": minilm.ensure_variant(1)}
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=paths["v1"], served_name=MODEL, prefill=0, decode=0, embed=1,
        embed_model_path=paths["v1"], embed_served_name=MODEL, embed_version="v1",
        versions=(VersionWorkers(version="v2", model_path=paths["v2"], colocated=0, embed=1),),
        port=port, run_dir=tmp_path / "run", heartbeat_interval_s=1.0, drain_timeout_s=5,
        router_env=ROUTER_ENV,
    )  # fmt: skip
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        register(cluster, MODEL, paths, max_context=256)
        engines = {"v1": cluster.worker("embed-0"), "v2": cluster.worker("v2-embed-0")}
        reference = {version: embed(w.engine_url) for version, w in engines.items()}
        assert not same(reference["v1"], reference["v2"]), "two versions, two sets of vectors"
        for worker in cluster.worker_status().values():  # each agent reported its files' sum
            assert worker["model_checksum"] == folder_checksum(paths[worker["model_version"]])

        walk_route(cluster, MODEL, lambda user: embed(cluster.router_url, user), reference,
                   matches=same)  # fmt: skip
    finally:
        cluster.stop()
