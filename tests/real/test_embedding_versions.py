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
from router.rollout.rollout import share_of
from tests.embedding_vectors import cosine, vectors

MODEL = "minilm-versions"
OPERATOR = "rollout-operator"
TEXTS = ["The capital of France is Paris.", "Disaggregated serving moves KV blocks."]


def admin(cluster: LocalCluster, method: str, path: str, body: dict | None = None) -> dict:
    answer = httpx.request(method, cluster.router_url + path, json=body, timeout=30,
                           headers={"Authorization": f"Bearer {OPERATOR}"})  # fmt: skip
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


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
        router_env={"PDSERVE_ADMIN_TOKENS": f"sre:operator:{OPERATOR}"},
    )  # fmt: skip
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        for version, path in paths.items():
            admin(cluster, "POST", "/admin/v1/models", {
                "model_id": MODEL, "version": version, "artifact": str(path),
                "max_context": 256, "tokenizer": str(path), "checksum": folder_checksum(path),
            })  # fmt: skip
        engines = {"v1": cluster.worker("embed-0"), "v2": cluster.worker("v2-embed-0")}
        reference = {version: embed(w.engine_url) for version, w in engines.items()}
        assert not same(reference["v1"], reference["v2"]), "two versions, two sets of vectors"
        for worker in cluster.worker_status().values():  # each agent reported its files' sum
            assert worker["model_checksum"] == folder_checksum(paths[worker["model_version"]])

        admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v1"})
        assert same(embed(cluster.router_url, "anyone"), reference["v1"])

        admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {
            "prod": "v1", "canary": {"version": "v2", "weight": 0.5, "stickiness": "user"},
            "gate": {"min_requests": 1, "max_ttft_p99_ratio": 1000, "max_itl_p99_ratio": 1000},
        })  # fmt: skip
        users = [f"user-{n}" for n in range(8)]
        sides = {user: "v2" if share_of(MODEL, user) < 0.5 else "v1" for user in users}
        assert set(sides.values()) == {"v1", "v2"}
        for user in users:
            assert same(embed(cluster.router_url, user), reference[sides[user]]), user

        promoted = admin(cluster, "POST", f"/admin/v1/routes/{MODEL}/promote")
        assert promoted["prod"] == "v2"
        for user in users[:3]:
            assert same(embed(cluster.router_url, user), reference["v2"]), user
    finally:
        cluster.stop()
