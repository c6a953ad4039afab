"""With ``batch_prefill_take_back``, a batch line's prefill gives way to an interactive
prompt sent to its worker: the router cancels it (the engine aborts it), the interactive
prompt is answered, and the line is sent again and answered as it is alone
(``router/orchestration/take_back.py``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster
from sim.profile import load_profile
from tests.clusters import MODEL, small_sim_cluster
from tests.conditions import wait_for

pytestmark = pytest.mark.slow  # a sim P/D cluster of its own, ~15 s

TENANTS = {"jobs": {"keys": ["key-jobs"]}, "app": {"keys": ["key-app"]}}
BATCH_PROMPT = list(range(1000, 2500))  # 1500 tokens: 6 steps of 256, 3 s to prefill


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    folder = tmp_path_factory.mktemp("take-back")
    # Slow, small steps: a batch prefill spans several, so a prompt arrives mid-prefill.
    profile = dataclasses.replace(
        load_profile("tiny-cpu"), name="slow-steps", prefill_ms_curve=(),
        prefill_ms_per_token=2.0, prefill_ms_per_kpair=0.0, prefill_ms_per_context=0.0,
        max_num_batched_tokens=256,
    )  # fmt: skip
    path = folder / "slow-steps.json"
    path.write_text(json.dumps(dataclasses.asdict(profile)))
    router_env = {
        "PDSERVE_TENANTS": json.dumps(TENANTS),
        "PDSERVE_BATCH_POLL_S": "0.2",
        "PDSERVE_TTFT_SLO_S": "30",
        "PDSERVE_BATCH_PREFILL_TAKE_BACK": "true",  # off by default
    }
    with small_sim_cluster(folder, sim_profile=str(path), router_env=router_env) as local:
        yield local


def router_total(cluster: LocalCluster, name: str) -> float:
    return total(scrape(cluster.router_url + "/metrics"), name)


def prefill_engine(cluster: LocalCluster, name: str) -> float:
    return total(scrape(cluster.worker("prefill-0").engine_url + "/metrics"), name)


def completion(cluster: LocalCluster, key: str, prompt: list[int]) -> httpx.Response:
    return httpx.post(
        cluster.router_url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
        json={"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0}, timeout=60,
    )  # fmt: skip


def test_an_interactive_prompt_takes_back_a_batch_prefill_and_the_line_still_answers(cluster):
    jobs = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="key-jobs", max_retries=0)
    body = {"model": MODEL, "prompt": BATCH_PROMPT, "max_tokens": 4, "temperature": 0}
    line = {"custom_id": "doc-1", "method": "POST", "url": "/v1/completions", "body": body}
    uploaded = jobs.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    batch = jobs.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    aborted = "vllm:request_success_total"  # by finished_reason; the abort's is below
    wait_for(lambda: prefill_engine(cluster, "vllm:num_requests_running") == 1, 30,
             "the batch line prefilling")  # fmt: skip
    interactive = completion(cluster, "key-app", list(range(100, 120)))
    assert interactive.status_code == 200, interactive.text
    assert router_total(cluster, "pdserve_batch_prefills_taken_back_total") == 1
    aborts = scrape(cluster.worker("prefill-0").engine_url + "/metrics")
    assert total(aborts, aborted, finished_reason="abort") == 1  # freed there, not left to run
    # It was answered while the line waited: the line is not done yet.
    assert jobs.batches.retrieve(batch.id).request_counts.completed == 0

    wait_for(lambda: jobs.batches.retrieve(batch.id).status == "completed", 60, "batch done")
    done = jobs.batches.retrieve(batch.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 0)
    (output,) = [json.loads(x) for x in jobs.files.content(done.output_file_id).text.splitlines()]
    alone = completion(cluster, "key-jobs", BATCH_PROMPT).json()
    assert output["response"]["status_code"] == 200
    assert output["response"]["body"]["choices"][0]["text"] == alone["choices"][0]["text"]
