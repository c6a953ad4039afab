"""Two versions of the tiny model on real vLLM (two builds, seeds 0 and 1) as prod and
canary: greedy outputs follow the route, key by key, through the real OpenAI client, and
a promotion moves every key to the new version.

Its own cluster (one colocated engine per version), marked ``own_engines`` so it runs
before the shared real cluster starts.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from localrun.cluster import ClusterPlan, LocalCluster, VersionWorkers
from localrun.ports import free_ports
from modelstore import tiny_llama
from modelstore.checksum import folder_checksum
from router.rollout.rollout import share_of

MODEL = "tiny-versions"
OPERATOR = "rollout-operator"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "import os\nimport"]


def greedy(client: openai.OpenAI, prompt: str, user: str | None = None) -> str:
    extra = {"user": user} if user else {}
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, **extra
    )
    return answer.choices[0].text


def admin(cluster: LocalCluster, method: str, path: str, body: dict | None = None) -> dict:
    answer = httpx.request(method, cluster.router_url + path, json=body, timeout=30,
                           headers={"Authorization": f"Bearer {OPERATOR}"})  # fmt: skip
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


@pytest.mark.own_engines
def test_greedy_outputs_follow_the_route_between_two_real_versions(tmp_path):
    v1_path, v2_path = tiny_llama.ensure(), tiny_llama.ensure(seed=1)
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=v1_path, served_name=MODEL, prefill=0, decode=0, colocated=1,
        model_version="v1", versions=(VersionWorkers(version="v2", model_path=v2_path),),
        port=port, run_dir=tmp_path / "run", heartbeat_interval_s=1.0, drain_timeout_s=5,
        router_env={"PDSERVE_ADMIN_TOKENS": f"sre:operator:{OPERATOR}"},
    )  # fmt: skip
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        for version, path in (("v1", v1_path), ("v2", v2_path)):
            admin(cluster, "POST", "/admin/v1/models", {
                "model_id": MODEL, "version": version, "artifact": str(path),
                "max_context": 4096, "tokenizer": str(path), "checksum": folder_checksum(path),
            })  # fmt: skip
        reference = {
            version: [greedy(openai.OpenAI(base_url=w.engine_url + "/v1", api_key="x"), p)
                      for p in PROMPTS]
            for version, w in (("v1", cluster.worker("colocated-0")),
                               ("v2", cluster.worker("v2-colocated-0")))
        }  # fmt: skip
        assert reference["v1"] != reference["v2"], "two seeds, two models"
        # Each agent reported its files' checksum and timed its engine's prefill.
        workers = httpx.get(cluster.router_url + "/admin/workers", timeout=10,
                            headers={"Authorization": f"Bearer {cluster.admin_token}"})  # fmt: skip
        for worker in workers.json()["workers"]:
            path = v1_path if worker["model_version"] == "v1" else v2_path
            assert worker["model_checksum"] == folder_checksum(path)
            # Three sizes, twice if the 10-s budget allows (agent/prefill_probe.py); one
            # size's nonce tokenizes to a token or two more or less.
            sizes: list[int] = []
            for tokens in sorted(tokens for tokens, _ in worker["prefill_probe"]):
                if not sizes or tokens > 1.5 * sizes[-1]:
                    sizes.append(tokens)
            assert len(sizes) == 3, worker["prefill_probe"]
        client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="unused")

        admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v1"})
        assert [greedy(client, p, "anyone") for p in PROMPTS] == reference["v1"]

        admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {
            "prod": "v1", "canary": {"version": "v2", "weight": 0.5, "stickiness": "user"},
            "gate": {"min_requests": 1, "max_ttft_p99_ratio": 1000, "max_itl_p99_ratio": 1000},
        })  # fmt: skip
        users = [f"user-{n}" for n in range(8)]
        sides = {user: "v2" if share_of(MODEL, user) < 0.5 else "v1" for user in users}
        assert set(sides.values()) == {"v1", "v2"}
        for user in users:
            assert [greedy(client, p, user) for p in PROMPTS] == reference[sides[user]], user

        promoted = admin(cluster, "POST", f"/admin/v1/routes/{MODEL}/promote")
        assert promoted["prod"] == "v2"
        for user in users[:3]:
            assert [greedy(client, p, user) for p in PROMPTS] == reference["v2"]
    finally:
        cluster.stop()
