"""Failures on the real path: a dead prefill, a decode killed mid-stream, a client that leaves."""

from __future__ import annotations

import os
import signal

import httpx
import openai
import pytest

from loadgen.prometheus_text import scrape, scrape_or_none, total
from localrun.ports import free_ports
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import generate

LONG_STREAM = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0, "stream": True}


def test_failed_prefill_is_retried_on_another_prefill_worker(cluster, router_url):
    (dead_port,) = free_ports(1)
    dead = {
        "worker_id": "prefill-dead",
        "role": "prefill",
        "model": MODEL,
        "engine_url": f"http://127.0.0.1:{dead_port}",  # nothing listens: connection refused
    }

    def retries() -> float:
        return total(scrape(router_url + "/metrics"), "pdserve_prefill_retries_total")

    before = retries()
    statuses = []
    try:
        # Round-robin meets the dead worker within two requests, unless the router's own
        # health probe takes it out first; registering again puts it back in rotation.
        for _ in range(10):
            cluster.admin("POST", "/admin/workers/register", dead, as_worker="prefill-dead")
            for _ in range(2):
                body = {"model": MODEL, "prompt": "retry me", "max_tokens": 4}
                result = generate(router_url, "/v1/completions", body)
                statuses.append(result.status)
            if retries() > before:
                break
        assert set(statuses) == {200}
        assert retries() > before
        assert cluster.worker_status()["prefill-dead"]["healthy"] is False
    finally:
        cluster.admin("DELETE", "/admin/workers/prefill-dead", as_worker="prefill-dead")


def test_client_disconnect_aborts_the_decode_request(router_url, decode_engine_url):
    def decode_gauges() -> tuple[float, float]:
        # A starved engine can take longer than a default scrape timeout to answer.
        samples = scrape_or_none(decode_engine_url + "/metrics", timeout_s=15)
        if samples is None:
            return float("inf"), float("nan")  # no answer yet: not idle
        return (
            total(samples, "vllm:num_requests_running"),
            total(samples, "vllm:generation_tokens_total"),
        )

    generated_before = total(
        scrape(decode_engine_url + "/metrics", timeout_s=15), "vllm:generation_tokens_total"
    )
    body = {"model": MODEL, "prompt": "a long story", **LONG_STREAM}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", router_url + "/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert sum(1 for line, _ in zip(lines, range(6), strict=False) if line) >= 3
    wait_for(lambda: decode_gauges()[0] == 0, 120, "decode to end the orphaned request")
    # Had it run to the end, decode would have generated every one of max_tokens.
    generated = decode_gauges()[1] - generated_before
    assert 0 < generated < LONG_STREAM["max_tokens"] / 2


def test_decode_killed_mid_stream_ends_in_an_error_event_then_recovers(cluster, router_url):
    client = openai.OpenAI(base_url=router_url + "/v1", api_key="unused", max_retries=0)
    decode = cluster.worker_status()["decode-0"]
    stream = client.completions.create(
        model=MODEL,
        prompt="tell me everything",
        max_tokens=3000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.append(chunk.choices[0].text)
            if len(received) == 5:
                os.kill(decode["engine_pid"], signal.SIGKILL)
    assert len(received) >= 5, "the stream must have started before the kill"
    assert "mid-stream" in str(caught.value) or "before [DONE]" in str(caught.value)

    # The agent restarts vLLM (a new incarnation) and the router serves again.
    wait_for(
        lambda: (
            (w := cluster.worker_status().get("decode-0")) is not None
            and w["eligible"]
            and w["incarnation"] > decode["incarnation"]
        ),
        300,
        "the decode agent to restart its engine",
    )
    result = generate(router_url, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "again"}], "max_tokens": 4,
    })  # fmt: skip
    assert result.status == 200 and result.text
