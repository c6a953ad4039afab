"""The drop-in request corpus: request shapes chosen from the OpenAI and vLLM API references.

Used by the real-tier differential test (``tests/real/test_drop_in.py``: the router's
P/D path against a plain colocated vLLM) and by ``benchmarks.router_diff`` (one router
tree against another, in front of the same engines). ``COMPLETIONS`` and ``CHATS`` map a
case's name to the part of a request body it varies; ``request`` adds the rest.
"""

from __future__ import annotations

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


ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def cases() -> list[tuple[str, str, str, dict]]:
    """Every case as (kind, path, name, shape): the completions, then the chats."""
    return [
        *(("completions", ENDPOINTS["completions"], name, shape)
          for name, shape in COMPLETIONS.items()),
        *(("chat", ENDPOINTS["chat"], name, shape) for name, shape in CHATS.items()),
    ]  # fmt: skip


def request(shape: dict, model: str) -> dict:
    """The body sent for ``shape``: greedy and 8 tokens unless it says otherwise, a None
    value meaning the field is left out, and ``model`` unless the shape names its own."""
    body = {**GREEDY, **shape}
    body = {k: v for k, v in body.items() if v is not None}
    own = body.pop("model", None)
    return {**body, "model": own or model}
