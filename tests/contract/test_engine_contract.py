"""The engine contract: what the router and agents rely on from an engine.

Every test runs against the simulator (fast tier) and against real vLLM (the
``vllm`` tier) with the same assertions: API shapes, ``/tokenize`` agreeing with
the router's own tokenizer, ``kv_transfer_params``, metric names and types, and
KV events whose block hashes are the ones the router computes. This suite is what
keeps the sim honest.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass

import httpx
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from contracts.block_hashing import block_hashes, external_block_hash, none_hash, sha256_pickle
from contracts.kv_events import BlocksStored, decode_batch
from contracts.tokenization import load_tokenizer
from kvtransfer.handoff import PREFILL_REQUEST_PARAMS, parse_handoff
from localrun.cluster import LocalCluster
from tests.clusters import COLOCATED_MODEL, MODEL


@dataclass(frozen=True)
class Engines:
    """One engine of each role, addressed directly (no router in between)."""

    kind: str
    colocated_url: str
    producer_url: str
    consumer_url: str
    colocated_events: str  # ZMQ endpoint the colocated engine publishes on
    model_path: str
    block_size: int
    max_model_len: int


@pytest.fixture(
    scope="module", params=["sim", pytest.param("vllm", marks=pytest.mark.vllm)]
)  # fmt: skip
def engines(request: pytest.FixtureRequest) -> Engines:
    cluster: LocalCluster = request.getfixturevalue(
        "sim_cluster" if request.param == "sim" else "cluster"
    )
    colocated = cluster.worker("colocated-0")
    return Engines(
        kind=request.param,
        colocated_url=colocated.engine_url,
        producer_url=cluster.worker("prefill-0").engine_url,
        consumer_url=cluster.worker("decode-0").engine_url,
        colocated_events=f"tcp://127.0.0.1:{colocated.kv_events_port}",
        model_path=str(cluster.plan.model_path),
        block_size=cluster.plan.block_size or 128,  # vLLM CPU's default, and tiny-cpu's
        max_model_len=cluster.plan.max_model_len,
    )


# Generous: on the 2-core test box a real engine next to two spinning NIXL threads
# has taken over 10 s to answer even /metrics.
ENGINE_TIMEOUT_S = 60


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url, json=body, timeout=120)


def test_models_lists_the_served_name(engines: Engines):
    listing = httpx.get(engines.colocated_url + "/v1/models", timeout=ENGINE_TIMEOUT_S).json()
    assert listing["object"] == "list"
    assert [(m["id"], m["object"]) for m in listing["data"]] == [(COLOCATED_MODEL, "model")]


def test_whole_completion_has_openai_shape_and_usage(engines: Engines):
    body = {"model": COLOCATED_MODEL, "prompt": "The sky is", "max_tokens": 5,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    answer = post(engines.colocated_url + "/v1/completions", body).json()
    assert answer["object"] == "text_completion"
    (choice,) = answer["choices"]
    assert isinstance(choice["text"], str) and choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 5
    usage = answer["usage"]
    assert usage["completion_tokens"] == 5
    prompt_ids = load_tokenizer(engines.model_path).completion_ids("The sky is")
    assert usage["prompt_tokens"] == len(prompt_ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


def test_streamed_chat_has_openai_chunks_usage_and_done(engines: Engines):
    body = {"model": COLOCATED_MODEL, "messages": [{"role": "user", "content": "Hi there"}],
            "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    chat_url = engines.colocated_url + "/v1/chat/completions"
    with httpx.stream("POST", chat_url, json=body, timeout=ENGINE_TIMEOUT_S) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: ") :] for line in reply.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content_chunks = [c for c in chunks if c["choices"]]
    assert content_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    prompt_ids = load_tokenizer(engines.model_path).chat_ids(body["messages"])
    assert chunks[-1]["usage"]["prompt_tokens"] == len(prompt_ids)


def streamed_chunks(url: str, body: dict) -> list[dict]:
    """The JSON chunks of a stream, ``[DONE]`` required and left out."""
    with httpx.stream("POST", url, json=body, timeout=ENGINE_TIMEOUT_S) as reply:
        assert reply.status_code == 200, reply.read()
        data = [line[len("data: ") :] for line in reply.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_stream_interval_sends_the_first_token_alone_then_that_many_per_chunk(engines: Engines):
    """A request's ``stream_interval`` (vLLM 0.32): the first and the last chunk go out at
    once, every other one carries that many tokens; the tokens are the same either way."""
    body = {"model": COLOCATED_MODEL, "prompt": "Count the tokens in each chunk:",
            "max_tokens": 10, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}  # fmt: skip
    url = engines.colocated_url + "/v1/completions"
    per_token = streamed_chunks(url, body)
    batched = streamed_chunks(url, {**body, "stream_interval": 4})
    per_chunk = [c["choices"][0]["token_ids"] for c in batched]
    assert [len(ids) for ids in per_chunk] == [1, 4, 4, 1]
    assert [t for ids in per_chunk for t in ids] == [
        t for c in per_token for t in c["choices"][0]["token_ids"]
    ]
    assert "".join(c["choices"][0]["text"] for c in batched) == "".join(
        c["choices"][0]["text"] for c in per_token
    )
    assert batched[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "request_body",
    [
        {"prompt": "Tokenize me, the way the router would. Twice: tokenize me!"},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "What is a KV cache?"}]},
        {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is"}, {"type": "text", "text": "a KV cache?"}]}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Hi."},
                      {"role": "developer", "content": "Answer in French."}]},
        {"messages": [{"role": "user", "content": "Hi."}], "add_generation_prompt": False},
    ],
    ids=["completion", "chat", "chat-content-parts", "chat-developer-role",
         "chat-no-generation-prompt"],
)  # fmt: skip
def test_tokenize_equals_the_routers_own_tokenizer(engines: Engines, request_body: dict):
    answer = post(engines.colocated_url + "/tokenize", {"model": COLOCATED_MODEL, **request_body})
    assert answer.status_code == 200, answer.text
    ours = load_tokenizer(engines.model_path).request_ids(
        request_body, chat="messages" in request_body
    )
    assert answer.json()["tokens"] == ours


def test_producer_answers_do_remote_decode_with_a_valid_handoff(engines: Engines):
    body = {"model": MODEL, "prompt": "Hand this prompt's KV to a decode worker, please.",
            "max_tokens": 1, "kv_transfer_params": PREFILL_REQUEST_PARAMS}  # fmt: skip
    answer = post(engines.producer_url + "/v1/completions", body).json()
    handoff = parse_handoff(answer["kv_transfer_params"], issued_at_s=0.0)
    assert handoff.raw["do_remote_prefill"] is True
    assert handoff.remote_request_id
    assert handoff.remote_block_ids


def test_unknown_model_is_a_404_in_openai_error_shape(engines: Engines):
    answer = post(engines.colocated_url + "/v1/completions", {"model": "nope", "prompt": "x"})
    assert answer.status_code == 404
    assert {"message", "type", "code"} <= answer.json()["error"].keys()


def test_context_window_refuses_a_longer_prompt_and_clamps_a_longer_output(engines: Engines):
    """The router's context-length rule (router/prepare/context_window.py) is this one."""
    limit = engines.max_model_len
    over = {"model": COLOCATED_MODEL, "prompt": [7] * (limit + 1), "max_tokens": 1}
    answer = post(engines.colocated_url + "/v1/completions", over)
    assert answer.status_code == 400
    assert "maximum context length" in answer.json()["error"]["message"]
    near = {"model": COLOCATED_MODEL, "prompt": [7] * (limit - 4), "max_tokens": 50,
            "ignore_eos": True, "temperature": 0}  # fmt: skip
    answer = post(engines.colocated_url + "/v1/completions", near)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 4


# The vLLM metrics pdserve reads (agents, router, benchmarks), with their types.
REQUIRED_METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def test_metrics_have_vllms_names_and_types(engines: Engines):
    text = httpx.get(engines.colocated_url + "/metrics", timeout=ENGINE_TIMEOUT_S).text
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert {name: families.get(name) for name in REQUIRED_METRICS} == REQUIRED_METRICS


def test_kv_events_carry_the_block_hashes_the_router_computes(engines: Engines):
    context = zmq.Context.instance()
    subscriber = context.socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.connect(engines.colocated_events)
    tokenizer = load_tokenizer(engines.model_path)
    try:
        # ZMQ drops what is published before the subscription is up: send fresh
        # prompts until one's events arrive, then look for that prompt's blocks.
        for attempt in itertools.count():
            prompt = f"{uuid.uuid4().hex} " + " ".join(f"word{i}" for i in range(400))
            body = {"model": COLOCATED_MODEL, "prompt": prompt, "max_tokens": 1}
            assert post(engines.colocated_url + "/v1/completions", body).status_code == 200
            if subscriber.poll(2000) or attempt >= 20:
                break
        ids = tokenizer.completion_ids(prompt)
        expected = [
            external_block_hash(h)
            for h in block_hashes(ids, engines.block_size, sha256_pickle, none_hash(sha256_pickle))
        ]
        assert len(expected) >= 2, "the prompt must fill at least two blocks"
        stored: list[int] = []
        while subscriber.poll(3000):
            _, _, payload = subscriber.recv_multipart()
            for event in decode_batch(payload).events:
                if isinstance(event, BlocksStored):
                    stored += event.block_hashes
            if set(expected) <= set(stored):
                break
        assert set(expected) <= set(stored), f"{engines.kind} never stored the prompt's blocks"
    finally:
        subscriber.close(linger=0)
