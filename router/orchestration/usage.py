"""The tokens an answer used, read from the engine's ``usage`` as the client gets it.

Streams carry usage only when asked (``stream_options.include_usage``), so the router
always asks its engine for it and, when the client did not, drops that one chunk (the
one with ``"choices": []``): the token counters then cover every request, and the
client sees exactly what vLLM would have sent it. Only events that mention
``"usage"`` are parsed; the rest of the stream is relayed as bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from router.orchestration.sse_events import EVENT_END

_USAGE = b'"usage"'


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


def usage_of(answer: Any) -> Usage | None:
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(prompt, completion or 0)


def usage_in_answer(payload: bytes) -> Usage | None:
    if _USAGE not in payload:
        return None
    try:
        return usage_of(json.loads(payload))
    except ValueError:
        return None


def usage_in_large_answer(payload: bytes) -> Usage | None:
    """As ``usage_in_answer``, for an answer too large to parse for its usage alone (an
    embeddings list, megabytes of vectors): vLLM writes ``usage`` last, so only the tail
    from it is parsed; the whole answer only when that tail is not the end."""
    start = payload.rfind(_USAGE)
    if start < 0:
        return None
    return usage_in_answer(b"{" + payload[start:]) or usage_in_answer(payload)


def usage_in_events(events: bytes, *, strip: bool) -> tuple[Usage | None, bytes]:
    """The last usage in a run of whole SSE events, and the events to relay: without the
    usage-only chunk when ``strip`` (the client did not ask for usage)."""
    if _USAGE not in events:
        return None, events
    found, kept = None, []
    for event in events.split(EVENT_END):
        if _USAGE in event and event.startswith(b"data: {"):
            try:
                chunk = json.loads(event[6:])
            except ValueError:
                chunk = None
            usage = usage_of(chunk)
            if usage is not None:
                found = usage
                if strip and not chunk.get("choices"):
                    continue
        kept.append(event)
    return found, EVENT_END.join(kept)


def with_usage_requested(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The streamed body with usage asked of the engine, and whether the client asked."""
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body, True
    options = options if isinstance(options, dict) else {}
    return {**body, "stream_options": {**options, "include_usage": True}}, False
