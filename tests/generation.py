"""Call an OpenAI-compatible endpoint over real HTTP and collect what came back."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx


@dataclass
class Generation:
    status: int
    text: str = ""
    texts: dict[int, str] = field(default_factory=dict)  # streamed: each choice's, by index
    token_ids: list[int] = field(default_factory=list)
    usage: dict | None = None
    done: bool = False  # streamed: saw data: [DONE]
    error_events: list[dict] = field(default_factory=list)
    body: dict | None = None
    response_ids: set[str] = field(default_factory=set)  # streamed: every chunk's id
    chunks: int = 0  # streamed: data chunks with choices
    # streamed: the distinct pdserve_migration fields, and the chunks before the first
    migrations: list[dict] = field(default_factory=list)
    chunks_before_migration: int | None = None


def choice_text(choice: dict) -> str:
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    if "message" in choice:
        return choice["message"].get("content") or ""
    return choice.get("text") or ""


def generate(
    base_url: str,
    path: str,
    body: dict,
    timeout_s: float = 120,
    on_chunk: Callable[[Generation], None] = lambda _: None,
) -> Generation:
    """POST ``body``; streamed or not, fold the answer into one ``Generation``
    (``on_chunk`` sees it after each streamed chunk is folded in)."""
    with httpx.Client(timeout=timeout_s) as client:
        if not body.get("stream"):
            response = client.post(base_url + path, json=body)
            result = Generation(status=response.status_code, body=response.json())
            if response.status_code == 200:
                choice = result.body["choices"][0]
                result.text = choice_text(choice)
                result.token_ids = list(choice.get("token_ids") or [])
                result.usage = result.body.get("usage")
            return result
        with client.stream("POST", base_url + path, json=body) as response:
            result = Generation(status=response.status_code)
            if response.status_code != 200:
                result.body = json.loads(response.read())
                return result
            event = None
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line.partition(":")[2].strip()
                elif line.startswith("data:"):
                    data = line.partition(":")[2].strip()
                    if data == "[DONE]":
                        result.done = True
                    elif event == "error":
                        result.error_events.append(json.loads(data))
                    else:
                        _fold_chunk(result, json.loads(data))
                        on_chunk(result)
                elif not line:
                    event = None
            return result


def _fold_chunk(result: Generation, chunk: dict) -> None:
    result.response_ids.add(chunk.get("id"))
    migration = chunk.get("pdserve_migration")
    if migration is not None and migration not in result.migrations:
        result.migrations.append(migration)
        if result.chunks_before_migration is None:
            result.chunks_before_migration = result.chunks
    result.chunks += bool(chunk.get("choices"))
    for choice in chunk.get("choices") or []:
        result.text += choice_text(choice)
        index = choice.get("index", 0)
        result.texts[index] = result.texts.get(index, "") + choice_text(choice)
        result.token_ids += choice.get("token_ids") or []
    if chunk.get("usage"):
        result.usage = chunk["usage"]
