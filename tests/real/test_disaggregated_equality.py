"""Greedy output through the router's P/D path equals one colocated vLLM, token for token."""

from __future__ import annotations

import pytest

from loadgen.prometheus_text import scrape, total
from tests.clusters import COLOCATED_MODEL, MODEL
from tests.generation import generate

COMPLETION_PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\nclass Reader:\n    def __init__(self, path):",
    "The quick brown fox " * 40,
    "# A module that parses configuration files and reports every error it finds\n" * 6,
]
CHAT_CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "List three prime numbers."},
    ],
    [
        {"role": "user", "content": "Write a haiku about caches."},
        {"role": "assistant", "content": "Blocks warm in memory"},
        {"role": "user", "content": "Now one about queues, " + "please " * 60},
    ],
    [{"role": "user", "content": "for line in open(path): " * 30}],
]
CASES = [
    *(pytest.param("/v1/completions", {"prompt": p}, id=f"completion{i}")
      for i, p in enumerate(COMPLETION_PROMPTS)),
    *(pytest.param("/v1/chat/completions", {"messages": m}, id=f"chat{i}")
      for i, m in enumerate(CHAT_CONVERSATIONS)),
]  # fmt: skip
GREEDY = {"temperature": 0, "max_tokens": 24, "ignore_eos": True, "return_token_ids": True}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("path", "payload"), CASES)
def test_disaggregated_greedy_output_equals_colocated(
    router_url, colocated_engine_url, path, payload, stream
):
    body = {**payload, **GREEDY, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    reference = generate(colocated_engine_url, path, {**body, "model": COLOCATED_MODEL})
    routed = generate(router_url, path, {**body, "model": MODEL})

    assert reference.status == 200 and routed.status == 200, routed.body
    assert len(reference.token_ids) == GREEDY["max_tokens"]
    assert routed.token_ids == reference.token_ids
    assert routed.text == reference.text
    assert routed.usage == reference.usage
    if stream:
        assert routed.done and not routed.error_events


def test_decode_pulls_the_prompt_kv_instead_of_computing_it(router_url, decode_engine_url):
    def by_source(source: str) -> float:
        samples = scrape(decode_engine_url + "/metrics")
        return total(samples, "vllm:prompt_tokens_by_source_total", source=source)

    before = {s: by_source(s) for s in ("external_kv_transfer", "local_compute")}
    prompt_tokens = 0
    for index in range(3):
        # A fresh prompt each time, so no prefix-cache hit on decode can hide a recompute.
        prompt = f"unique prompt number {index} for the transfer check: " + "data " * 50
        result = generate(router_url, "/v1/completions", {"model": MODEL, "prompt": prompt,
                                                          "max_tokens": 4})  # fmt: skip
        assert result.status == 200
        prompt_tokens += result.usage["prompt_tokens"]

    assert by_source("local_compute") - before["local_compute"] == 0
    assert by_source("external_kv_transfer") - before["external_kv_transfer"] == prompt_tokens
