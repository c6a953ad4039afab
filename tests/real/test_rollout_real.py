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
from tests.route_walk import ROUTER_ENV, register, walk_route

MODEL = "tiny-versions"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "import os\nimport"]


def greedy(client: openai.OpenAI, prompt: str, user: str | None = None) -> str:
    extra = {"user": user} if user else {}
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, **extra
    )
    return answer.choices[0].text


@pytest.mark.own_engines
def test_greedy_outputs_follow_the_route_between_two_real_versions(tmp_path):
    v1_path, v2_path = tiny_llama.ensure(), tiny_llama.ensure(seed=1)
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=v1_path, served_name=MODEL, prefill=0, decode=0, colocated=1,
        model_version="v1", versions=(VersionWorkers(version="v2", model_path=v2_path),),
        port=port, run_dir=tmp_path / "run", heartbeat_interval_s=1.0, drain_timeout_s=5,
        router_env=ROUTER_ENV,
    )  # fmt: skip
    cluster = LocalCluster(plan)
    try:
        cluster.start()
        register(cluster, MODEL, {"v1": v1_path, "v2": v2_path}, max_context=4096)
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

        walk_route(cluster, MODEL, lambda user: [greedy(client, p, user) for p in PROMPTS],
                   reference, matches=lambda ours, theirs: ours == theirs)  # fmt: skip
    finally:
        cluster.stop()
