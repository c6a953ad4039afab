"""A batch on real vLLM through the official ``openai`` SDK: chat lines run disaggregated
(prefill, NIXL, decode) at batch priority, and each greedy answer in the output file
equals, token for token, the colocated engine's answer to the same request."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.clusters import COLOCATED_MODEL, MODEL
from tests.conditions import wait_for

pytestmark = pytest.mark.vllm

QUESTIONS = [
    "What is the capital of France?",
    "Name a prime number.",
    "Say hello.",
    "Count to three.",
]


def chat(question: str) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 12,
        "temperature": 0,
    }


def test_a_chat_batch_answers_as_the_colocated_engine(router_url, colocated_engine_url):
    api = openai.OpenAI(base_url=router_url + "/v1", api_key="unused", max_retries=0)
    lines = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat(q)}
        for i, q in enumerate(QUESTIONS)
    ]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    uploaded = api.files.create(file=("chats.jsonl", data), purpose="batch")
    batch = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    ended = ("completed", "failed", "expired", "cancelled")
    wait_for(lambda: api.batches.retrieve(batch.id).status in ended, 300, "batch ended")
    done = api.batches.retrieve(batch.id)
    assert done.status == "completed" and done.request_counts.completed == len(QUESTIONS)
    out = {
        o["custom_id"]: o
        for o in map(json.loads, api.files.content(done.output_file_id).text.splitlines())
    }
    for i, question in enumerate(QUESTIONS):
        reference = httpx.post(
            colocated_engine_url + "/v1/chat/completions",
            json={**chat(question), "model": COLOCATED_MODEL},
            timeout=120,
        )
        answer = out[f"q{i}"]["response"]
        assert answer["status_code"] == 200
        assert (
            answer["body"]["choices"][0]["message"]["content"]
            == reference.json()["choices"][0]["message"]["content"]
        )
