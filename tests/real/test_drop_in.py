"""Differential: what a plain vLLM accepts, the router accepts and answers the same way.

Each request shape, chosen from the OpenAI and vLLM API references, goes to the
colocated vLLM directly and to the router's P/D path for the same weights. The status
codes must match; for 200s, every choice's text (by index), its finish reason and the
usage must match (greedy, so both sides generate the same tokens). Deliberate
differences are listed in DIFFERENT with their reasons.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx
import pytest

from tests.clusters import COLOCATED_MODEL, MODEL
from tests.generation import choice_text

GREEDY = {"temperature": 0, "max_tokens": 8}
USER = [{"role": "user", "content": "Name a prime number."}]
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}  # fmt: skip

COMPLETIONS = {
    "string": {"prompt": "def add(a, b):"},
    "one-string list": {"prompt": ["def add(a, b):"]},
    "token ids": {"prompt": [17, 42, 99, 7, 256]},
    "one token-id list": {"prompt": [[17, 42, 99, 7, 256]]},
    "two strings": {"prompt": ["def add(a, b):", "import os"]},
    "two token-id lists": {"prompt": [[17, 42, 99], [5, 6, 7, 8]]},
    "greedy n=2": {"prompt": "class Cache:", "n": 2},
    "seeded n=2": {"prompt": "class Cache:", "n": 2, "temperature": 0.8, "seed": 11},
    "two prompts, seeded n=2": {"prompt": ["class Cache:", "def main():"], "n": 2,
                                "temperature": 0.8, "seed": 5},
    "echo": {"prompt": "for x in range(3):", "echo": True},
    "logprobs": {"prompt": "while True:", "logprobs": 2},
    "stop string": {"prompt": "the the the the", "stop": ["the"], "max_tokens": 16},
    "no max_tokens": {"prompt": "return", "max_tokens": None},
    "penalties": {"prompt": "print(", "presence_penalty": 0.5, "frequency_penalty": 0.5},
    "vLLM extras": {"prompt": "import sys", "top_k": 5, "repetition_penalty": 1.2,
                    "min_tokens": 4, "ignore_eos": True},
    "stop_token_ids": {"prompt": "x = 1", "stop_token_ids": [1, 2]},
    "logit_bias": {"prompt": "y = 2", "logit_bias": {"42": 5}},
    "seeded sampling": {"prompt": "z = 3", "temperature": 0.8, "seed": 7},
    "stream": {"prompt": "if x:", "stream": True},
    "stream with usage": {"prompt": "else:", "stream": True,
                          "stream_options": {"include_usage": True}},
    "stream, two prompts": {"prompt": ["a = 1", "b = 2"], "stream": True,
                            "stream_options": {"include_usage": True}},
    "stream, 3 tokens a chunk": {"prompt": "elif y:", "stream": True, "stream_interval": 3,
                                 "max_tokens": 10, "stream_options": {"include_usage": True}},
    "max_tokens 0": {"prompt": "a", "max_tokens": 0},
    "no prompt": {"prompt": None},
    "unknown model": {"prompt": "a", "model": "no-such-model"},
    "empty prompt list": {"prompt": []},
}  # fmt: skip
CHATS = {
    "plain": {"messages": USER},
    "content parts": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Name a"}, {"type": "text", "text": "prime number."}]}]},
    "system and developer": {"messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "developer", "content": "Use digits."},
                                          *USER]},
    "named message": {"messages": [{"role": "user", "name": "ada", "content": "Hi."}]},
    "max_completion_tokens": {"messages": USER, "max_tokens": None,
                              "max_completion_tokens": 6},
    "logprobs": {"messages": USER, "logprobs": True, "top_logprobs": 2},
    "greedy n=2": {"messages": USER, "n": 2},
    "seeded n=3, streamed": {"messages": USER, "n": 3, "temperature": 1.0, "seed": 3,
                             "stream": True, "stream_options": {"include_usage": True}},
    "tools, choice none": {"messages": USER, "tools": [TOOL], "tool_choice": "none"},
    "json mode": {"messages": USER, "response_format": {"type": "json_object"}},
    "stop": {"messages": USER, "stop": ["\n"]},
    "stream with usage": {"messages": USER, "stream": True,
                          "stream_options": {"include_usage": True}},
    "stream, 4 tokens a chunk": {"messages": USER, "stream": True, "stream_interval": 4},
    "assistant prefill": {"messages": [*USER, {"role": "assistant", "content": "Seven"}],
                          "add_generation_prompt": False, "continue_final_message": True},
    "no messages": {"messages": []},
    "bad role content": {"messages": [{"role": "user", "content": 5}]},
}  # fmt: skip
# Shapes where pdserve answers differently on purpose, with the reason.
DIFFERENT: dict[str, str] = {}

CASES = [
    *(pytest.param("/v1/completions", body, id=f"completions: {name}")
      for name, body in COMPLETIONS.items()),
    *(pytest.param("/v1/chat/completions", body, id=f"chat: {name}")
      for name, body in CHATS.items()),
]  # fmt: skip


@dataclass
class Answer:
    status: int
    texts: dict[int, str] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    usage: dict | None = None
    error: dict | None = None
    done: bool = False


def ask(base_url: str, path: str, body: dict) -> Answer:
    """POST ``body`` and fold the answer (streamed or not) into texts by choice index."""
    with httpx.Client(timeout=180) as client:
        if not body.get("stream"):
            response = client.post(base_url + path, json=body)
            answer = Answer(response.status_code)
            payload = response.json()
            if response.status_code != 200:
                answer.error = payload.get("error")
                return answer
            for choice in payload["choices"]:
                answer.texts[choice["index"]] = choice_text(choice)
                answer.finish[choice["index"]] = choice.get("finish_reason")
            answer.usage = payload.get("usage")
            return answer
        with client.stream("POST", base_url + path, json=body) as response:
            answer = Answer(response.status_code)
            if response.status_code != 200:
                answer.error = json.loads(response.read()).get("error")
                return answer
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line.partition(":")[2].strip()
                if data == "[DONE]":
                    answer.done = True
                    continue
                chunk = json.loads(data)
                for choice in chunk.get("choices") or []:
                    index = choice["index"]
                    answer.texts[index] = answer.texts.get(index, "") + choice_text(choice)
                    if choice.get("finish_reason"):
                        answer.finish[index] = choice["finish_reason"]
                if chunk.get("usage"):
                    answer.usage = chunk["usage"]
            return answer


@pytest.mark.parametrize(("path", "shape"), CASES)
def test_router_answers_every_shape_as_vllm_does(router_url, colocated_engine_url, path, shape):
    body = {**GREEDY, **shape}
    body = {k: v for k, v in body.items() if v is not None}
    model = body.pop("model", None)
    reference = ask(colocated_engine_url, path, {**body, "model": model or COLOCATED_MODEL})
    routed = ask(router_url, path, {**body, "model": model or MODEL})
    assert routed.status == reference.status, (routed.error, reference.error)
    if reference.status != 200:
        assert routed.error and {"message", "type"} <= routed.error.keys()
        return
    assert routed.texts == reference.texts
    assert routed.finish == reference.finish
    assert routed.usage == reference.usage
    assert routed.done == reference.done
