"""Admission end to end on a sim cluster of its own (1 prefill, 1 decode), over real HTTP
and the real OpenAI client: limits refuse before any worker computes, a 429 always has
Retry-After and OpenAI's error shape, and predicted-TTFT early rejection costs nothing."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster
from modelstore import tiny_llama
from tests.clusters import small_sim_cluster
from tests.conditions import wait_for
from tests.sim.faults import set_faults

MODEL = tiny_llama.SERVED_NAME
TENANTS = {
    "capped": {"keys": ["key-capped"], "max_prompt_tokens": 300, "max_output_tokens": 16},
    "slow": {"keys": ["key-slow"], "rpm": 2},
    "open": {"keys": ["key-open"]},
    "narrow": {"keys": ["key-narrow"], "models": ["some-other-model"]},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with small_sim_cluster(
        tmp_path_factory.mktemp("admission"), max_model_len=4096,
        router_env={"PDSERVE_TENANTS": json.dumps(TENANTS), "PDSERVE_MAX_MESSAGES": "4",
                    "PDSERVE_MAX_OUTPUT_TOKENS_BY_MODEL": f"{MODEL}=64"},
    ) as local:  # fmt: skip
        yield local


def post(cluster: LocalCluster, body: dict, key: str = "key-open", **headers: str):
    headers = {"Authorization": f"Bearer {key}", **headers}
    return httpx.post(cluster.router_url + "/v1/chat/completions" if "messages" in body
                      else cluster.router_url + "/v1/completions",
                      json={"model": MODEL, **body}, headers=headers, timeout=60)  # fmt: skip


def engine_prompt_tokens(cluster: LocalCluster) -> float:
    return sum(
        total(scrape(w.engine_url + "/metrics"), "vllm:prompt_tokens_total")
        for w in cluster.workers
    )


def rejections(cluster: LocalCluster, reason: str) -> float:
    return total(scrape(cluster.router_url + "/metrics"), "pdserve_admission_rejections_total",
                 reason=reason)  # fmt: skip


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code


def test_oversized_requests_are_refused_before_any_worker_computes(cluster):
    before = engine_prompt_tokens(cluster)
    long_prompt = " ".join(["word"] * 400)
    cases = [
        ({"prompt": long_prompt, "max_tokens": 4}, "key-capped", "tenant_prompt_limit"),
        ({"prompt": "hi", "max_tokens": 17}, "key-capped", "tenant_output_limit"),
        ({"prompt": "hi", "max_tokens": 65}, "key-open", "model_output_limit"),
        ({"messages": [{"role": "user", "content": "x"}] * 5}, "key-open", "too_many_messages"),
        ({"prompt": " ".join(["word"] * 5000)}, "key-open", "context_length_exceeded"),
    ]
    for body, key, code in cases:
        assert_openai_error(post(cluster, body, key), 400, code)
    assert engine_prompt_tokens(cluster) == before, "a refused prompt reached an engine"


def test_a_tenants_output_cap_is_the_default_for_requests_that_set_none(cluster):
    answer = post(cluster, {"prompt": "count with me"}, "key-capped")
    assert answer.status_code == 200, answer.text
    assert 0 < answer.json()["usage"]["completion_tokens"] <= 16


def test_over_the_request_rate_is_429_with_retry_after_in_openais_shape(cluster):
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="key-slow", max_retries=0)
    for _ in range(2):
        client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    with pytest.raises(openai.RateLimitError) as refused:
        client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    response = refused.value.response
    assert_openai_error(response, 429, "rate_limit_rpm")
    # Two requests a minute: the next one is about 30 s away.
    assert 20 <= int(response.headers["retry-after"]) <= 30
    assert response.headers["x-pdserve-reject-reason"] == "rate_limit_rpm"
    # Other tenants have buckets of their own.
    assert post(cluster, {"prompt": "hello", "max_tokens": 2}).status_code == 200


def prefill_in_flight(cluster: LocalCluster) -> int:
    workers = cluster.admin("GET", "/admin/v1/pools")["models"][MODEL]["workers"]
    return sum(w["inflight_requests"] for w in workers if w["role"] == "prefill")


def prefill_seconds(cluster: LocalCluster) -> float:
    """Seconds the prefill engines took to their first tokens: their prefills."""
    return sum(
        total(scrape(w.engine_url + "/metrics"), "vllm:time_to_first_token_seconds_sum")
        for w in cluster.workers
        if w.role == "prefill"
    )


def test_a_prompt_past_its_slo_even_alone_is_a_413_before_any_worker_computes(cluster):
    """A 1-ms SLO: no wait would help this prompt, so no 429 to retry, on an idle pool."""
    body = {"prompt": " ".join(["word"] * 2000), "max_tokens": 2}
    before = engine_prompt_tokens(cluster)
    response = post(cluster, body, **{"x-pdserve-ttft-slo-ms": "1"})
    assert_openai_error(response, 413, "prompt_exceeds_ttft_slo")
    assert "retry-after" not in response.headers
    assert "even on idle workers" in response.json()["error"]["message"]
    assert engine_prompt_tokens(cluster) == before


def test_a_request_that_cannot_meet_its_ttft_target_behind_a_queue_is_refused_at_once(cluster):
    body = {"prompt": " ".join(["word"] * 2000), "max_tokens": 2}
    # Alone on idle workers: admitted, with its forecast (the second counts what the
    # first taught the predictor).
    for _ in range(2):
        alone = post(cluster, body)
        assert alone.status_code == 200, alone.text
    alone_ms = float(alone.headers["x-pdserve-predicted-ttft-ms"])
    # An SLO it meets alone with a fifth to spare, which 3001 tokens queued ahead break.
    slo = {"x-pdserve-ttft-slo-ms": str(math.ceil(alone_ms * 1.25))}
    # Behind a queue (a prefill the engine is told to run 20x slower) it is refused.
    assert set_faults(cluster, "prefill-0", slowdown=20).status_code == 200
    with ThreadPoolExecutor(1) as pool:
        # 3001 tokens: its prefill may finish during the check, and must be told apart.
        ahead_prompt = " ".join(["queue"] * 3001)
        ahead = pool.submit(post, cluster, {"prompt": ahead_prompt, "max_tokens": 1})
        try:
            wait_for(lambda: prefill_in_flight(cluster) > 0, 30, "a prefill in flight")
            before = engine_prompt_tokens(cluster)
            refused = rejections(cluster, "ttft_slo_unattainable")
            response = post(cluster, body, **slo)
            assert_openai_error(response, 429, "ttft_slo_unattainable")
            assert int(response.headers["retry-after"]) >= 1
            assert rejections(cluster, "ttft_slo_unattainable") == refused + 1
            # No engine saw the refused prompt (2000 tokens); the one ahead may have finished.
            assert engine_prompt_tokens(cluster) - before in (0, 3001, 2 * 3001)  # P, then D
        finally:
            set_faults(cluster, "prefill-0", slowdown=1)
        assert ahead.result(timeout=60).status_code == 200
    # A target the pool can meet is admitted; a client cannot ask for more than the model's.
    assert post(cluster, body, **{"x-pdserve-ttft-slo-ms": "60000"}).status_code == 200


def test_a_request_that_would_make_an_admitted_one_late_is_refused(cluster):
    """An engine prefills what waits in one step: sent behind a prefill whose deadline is
    near, even a short prompt would delay it. Refused, though it would be in time itself."""
    short = {"prompt": "a short one", "max_tokens": 1}
    assert post(cluster, short).status_code == 200  # on an idle pool: admitted
    # The urgent request's SLO: a quarter over what the predictor forecasts for a prompt
    # like it alone (an earlier test's slowed prefill may have taught it a slow engine),
    # and the engine slowed until its prefill runs well past that.
    prefilled_s = prefill_seconds(cluster)
    alone = post(cluster, {"prompt": "alone " + "urgent " * 99, "max_tokens": 1})
    assert alone.status_code == 200, alone.text
    alone_ms = (prefill_seconds(cluster) - prefilled_s) * 1000
    slo_ms = math.ceil(float(alone.headers["x-pdserve-predicted-ttft-ms"]) * 1.25)
    slowdown = min(10_000, max(100, math.ceil(3 * slo_ms / alone_ms)))
    assert set_faults(cluster, "prefill-0", slowdown=slowdown).status_code == 200
    with ThreadPoolExecutor(1) as pool:
        urgent = {"prompt": "later " + "urgent " * 99, "max_tokens": 1}
        sent_s = time.monotonic()
        ahead = pool.submit(post, cluster, urgent, **{"x-pdserve-ttft-slo-ms": str(slo_ms)})
        try:
            # Its deadline is at most its SLO after it was sent (admission may give a
            # prompt slow alone up to the SLO itself); its prefill, slowed, runs on.
            wait_for(lambda: ahead.done() or (time.monotonic() - sent_s > slo_ms / 1000
                                              and prefill_in_flight(cluster) > 0),
                     30, "the urgent prefill in flight past its deadline")  # fmt: skip
            assert not ahead.done(), ahead.result().text
            response = post(cluster, short)
            assert_openai_error(response, 429, "ttft_slo_unattainable")
            assert "already admitted" in response.json()["error"]["message"]
        finally:
            set_faults(cluster, "prefill-0", slowdown=1)
        assert ahead.result(timeout=60).status_code == 200
    assert post(cluster, short).status_code == 200


def test_a_malformed_ttft_header_is_a_400_naming_it(cluster):
    response = post(cluster, {"prompt": "x", "max_tokens": 1}, **{"x-pdserve-ttft-slo-ms": "soon"})
    assert_openai_error(response, 400, "invalid_header")
    assert response.json()["error"]["param"] == "x-pdserve-ttft-slo-ms"


def test_admitted_requests_export_their_predicted_ttft(cluster):
    answer = post(cluster, {"prompt": "predict me", "max_tokens": 2, "stream": False})
    assert answer.status_code == 200
    assert int(answer.headers["x-pdserve-predicted-ttft-ms"]) >= 0
    with httpx.stream("POST", cluster.router_url + "/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": "predict me", "max_tokens": 2,
                            "stream": True},
                      headers={"Authorization": "Bearer key-open"}) as streamed:  # fmt: skip
        assert streamed.status_code == 200
        assert int(streamed.headers["x-pdserve-predicted-ttft-ms"]) >= 0
    samples = scrape(cluster.router_url + "/metrics")
    assert total(samples, "pdserve_predicted_ttft_seconds_count") > 0
    # What the router's own tokenizing cost, beside the process's CPU (issue 18's ratio).
    assert total(samples, "pdserve_tokenize_cpu_seconds_count") > 0
    assert total(samples, "pdserve_tokenize_cpu_seconds_sum") > 0
    assert total(samples, "pdserve_prefill_queue_limit_tokens") > 0


def test_a_tenant_may_use_only_its_allowed_models_and_lists_only_those(cluster):
    before = engine_prompt_tokens(cluster)
    refused = post(cluster, {"prompt": "hello", "max_tokens": 1}, key="key-narrow")
    assert_openai_error(refused, 403, "model_not_allowed")
    assert refused.json()["error"]["param"] == "model"
    assert engine_prompt_tokens(cluster) == before
    listed = httpx.get(cluster.router_url + "/v1/models",
                       headers={"Authorization": "Bearer key-narrow"}).json()["data"]  # fmt: skip
    assert listed == []
    assert post(cluster, {"prompt": "hello", "max_tokens": 1}).status_code == 200
