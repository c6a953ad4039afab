"""``/v1/embeddings`` through the router on real vLLM pooling engines (all-MiniLM-L6-v2):
held against one engine's own answer (the same status, error shape, vectors and usage),
also for requests large enough to be cut across the two workers and merged, and
against sentence-transformers' own encoding of the same folder."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from loadgen.prometheus_text import scrape, total
from modelstore import minilm
from tests.clusters import EMBED_OPEN_KEY as OPEN_KEY
from tests.clusters import METERED_KEY, METERED_TPM
from tests.conditions import wait_for
from tests.embedding_vectors import cosine, vectors

pytestmark = pytest.mark.vllm

MODEL = minilm.SERVED_NAME
OPEN = {"Authorization": f"Bearer {OPEN_KEY}"}  # a tenant without limits (keys are on)
TEXTS = ["The capital of France is Paris.", "A cat sat on the mat.", "Disaggregated serving"]
LONG = "word " * 400  # past the model's 256-token context
# Enough inputs to be cut in two (embedding_split_min_inputs 32) while both workers idle.
MANY = [f"Sentence {i}: a request cut across workers keeps its order." for i in range(80)]
CASES = {
    "one string": {"input": TEXTS[0]},
    "strings": {"input": TEXTS},
    "token ids": {"input": [101, 7592, 2088, 102]},
    "token id lists": {"input": [[101, 7592, 102], [101, 2088, 2003, 1012, 102]]},
    "base64": {"input": TEXTS, "encoding_format": "base64"},
    "user": {"input": TEXTS[1], "user": "tenant-7"},
    "truncated": {"input": LONG, "truncate_prompt_tokens": 32},
    # vLLM's own refusals, passed on as it answers them
    "dimensions": {"input": TEXTS[0], "dimensions": 64},
    "past the context": {"input": LONG},
    "no inputs": {"input": []},
    "many, cut": {"input": MANY},
    "many, cut, base64": {"input": MANY, "encoding_format": "base64"},
    "many, cut, token id lists": {"input": [[101, 7592 + i, 102] for i in range(80)]},
    "many, cut, one past the context": {"input": [*MANY[:60], LONG, *MANY[60:]]},
}


@pytest.fixture(scope="module")
def urls(embed_cluster) -> tuple[str, str]:
    return embed_cluster.router_url, embed_cluster.worker("embed-0").engine_url


def routed(url: str, path: str, body: dict, headers: dict = OPEN) -> httpx.Response:
    """A request through the router (client keys are on: the open tenant's by default)."""
    return httpx.post(url + path, json=body, headers=headers, timeout=60)


def both_idle(cluster) -> bool:
    """The router sees both workers idle (their engines' last report), as a cut needs."""
    workers = cluster.worker_status().values()
    return len(workers) == 2 and all(
        w["load"]["num_requests_running"] + w["load"]["num_requests_waiting"] == 0 for w in workers
    )


@pytest.mark.parametrize("case", CASES)
def test_the_router_answers_as_the_engine_does(embed_cluster, urls, case):
    router_url, engine_url = urls
    wait_for(lambda: both_idle(embed_cluster), 30, "both embedding workers idle")
    body = {"model": MODEL, **CASES[case]}
    through = routed(router_url, "/v1/embeddings", body)
    direct = httpx.post(engine_url + "/v1/embeddings", json=body, timeout=60)
    assert through.status_code == direct.status_code, (through.text, direct.text)
    if direct.status_code != 200:
        error = through.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"} and error["message"]
        return
    ours, theirs = through.json(), direct.json()
    assert ours["usage"] == theirs["usage"] and ours["usage"]["prompt_tokens"] > 0
    assert ours["model"] == MODEL and len(ours["data"]) == len(theirs["data"])
    for a, b in zip(vectors(ours), vectors(theirs), strict=True):
        assert cosine(a, b) >= 0.9999


def test_vectors_match_sentence_transformers_own_encoding(urls):
    """Pooling (mean) and normalization right end to end, not only the engine's."""
    from sentence_transformers import SentenceTransformer

    answer = routed(urls[0], "/v1/embeddings", {"model": MODEL, "input": TEXTS}).json()
    reference = SentenceTransformer(str(minilm.ensure()), device="cpu").encode(TEXTS)
    for ours, theirs in zip(vectors(answer), reference, strict=True):
        assert cosine(ours, theirs.astype(np.float64)) >= 0.999
        assert np.linalg.norm(ours) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_the_openai_sdk_works_unchanged(urls, encoding_format):
    client = openai.OpenAI(base_url=urls[0] + "/v1", api_key=OPEN_KEY)
    answer = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format=encoding_format)
    assert [d.index for d in answer.data] == [0, 1, 2]
    first = answer.data[0].embedding
    if encoding_format == "base64":  # the SDK hands back what the server sent
        first = np.frombuffer(base64.b64decode(first), dtype="<f4").tolist()
    assert len(first) == 384 and answer.usage.prompt_tokens > 0


def test_a_chat_on_an_embedding_model_is_a_clear_400(urls):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    answer = routed(urls[0], "/v1/chat/completions", chat)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "wrong_model_kind"


def test_embedding_requests_and_their_tokens_are_counted(urls):
    router_url = urls[0]

    def counted() -> tuple[float, float]:
        metrics = scrape(router_url + "/metrics")
        return (total(metrics, "pdserve_requests_total", model=MODEL, endpoint="embeddings",
                      status="200"),
                total(metrics, "pdserve_prompt_tokens_total", model=MODEL))  # fmt: skip

    requests_before, tokens_before = counted()
    answer = routed(router_url, "/v1/embeddings", {"model": MODEL, "input": TEXTS}).json()
    requests_after, tokens_after = counted()
    assert requests_after - requests_before == 1
    assert tokens_after - tokens_before == answer["usage"]["prompt_tokens"]


def test_a_large_request_is_cut_across_idle_workers(embed_cluster, urls):
    router_url = urls[0]

    def sent() -> tuple[float, ...]:
        metrics = scrape(router_url + "/metrics")
        per_worker = [total(metrics, "pdserve_routed_requests_total", worker=w, role="embed")
                      for w in embed_cluster.worker_status()]  # fmt: skip
        return (total(metrics, "pdserve_embedding_splits_total", model=MODEL, pieces="2"),
                *per_worker)  # fmt: skip

    wait_for(lambda: both_idle(embed_cluster), 30, "both embedding workers idle")
    before = sent()
    for _ in range(2):  # back to back: the second one too, before any heartbeat says idle
        answer = routed(router_url, "/v1/embeddings", {"model": MODEL, "input": MANY}).json()
        assert [d["index"] for d in answer["data"]] == list(range(len(MANY)))
    assert [a - b for a, b in zip(sent(), before, strict=True)] == [2, 2, 2]


def test_status_and_metrics_show_the_embedding_model(embed_cluster, urls):
    """``pdserve status``'s snapshot: the pool, latency and tokens/s; Prometheus: latency
    by mode ``embed`` and $/1M input tokens of the embed pool (the default price)."""
    httpx.post(
        headers=OPEN,
        url=urls[0] + "/v1/embeddings",
        json={"model": MODEL, "input": TEXTS},
        timeout=60,
    )
    models = {m["model"]: m for m in embed_cluster.admin("GET", "/admin/v1/status")["models"]}
    mine = models[MODEL]
    assert mine["workers_by_role"] == {"embed": 2}
    assert mine["embedding_samples"] >= 1 and 0 < mine["embedding_latency_p50_s"] < 60
    assert mine["input_tokens_per_s"] > 0 and mine["ttft_samples"] == 0

    def priced() -> bool:  # the cost window fills from heartbeats (every second here)
        metrics = scrape(urls[0] + "/metrics")
        return total(metrics, "pdserve_cost_usd_per_million_tokens", model=MODEL, pool="embed",
                     direction="input") > 0  # fmt: skip

    wait_for(priced, 30, "$/1M input tokens of the embed pool")
    metrics = scrape(urls[0] + "/metrics")
    assert total(metrics, "pdserve_e2e_request_latency_seconds_count", model=MODEL,
                 mode="embed") >= 1  # fmt: skip


def test_a_tenants_tpm_counts_embedding_tokens_as_the_engine_does(urls):
    """Two requests of ``count`` tokens fit the tenant's minute, a third is a 429 with
    Retry-After (all-MiniLM's tokenizer.json pads to 128: counted so, the first would be)."""
    from transformers import AutoTokenizer

    text = "word " * 20
    count = len(AutoTokenizer.from_pretrained(str(minilm.ensure()))(text)["input_ids"])
    assert 2 * count <= METERED_TPM < 3 * count
    headers = {"Authorization": f"Bearer {METERED_KEY}"}
    body = {"model": MODEL, "input": text}
    answers = [routed(urls[0], "/v1/embeddings", body, headers) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429], answers[-1].text
    assert answers[0].json()["usage"]["prompt_tokens"] == count
    assert int(answers[2].headers["retry-after"]) >= 1
    error = answers[2].json()["error"]
    assert error["code"] == "rate_limit_tpm" and set(error) >= {"message", "type", "param"}
