"""Relay an engine's SSE stream to the client, event-aligned.

Invariants:
- Only whole SSE events (ending in a blank line) are forwarded, so a failure
  mid-stream can always be followed by a clean ``event: error``.
- A stream that ends without ``data: [DONE]`` is a failure, never a silent
  truncation.
- However the relay ends (done, failure, client gone), the engine response is
  closed, which makes vLLM abort the request and free its KV blocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp

from router.errors import UpstreamFailed, UpstreamTimeout, sse_error_event
from router.usage import Usage, usage_in_events

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_DONE = b"data: [DONE]"
_EVENT_END = b"\n\n"


@dataclass(slots=True)
class StreamStats:
    started_s: float
    first_byte_s: float | None = None
    events: int = 0
    completed: bool = False
    failure: str | None = None
    usage: Usage | None = None  # the engine's, from its usage chunk


async def relay_sse(
    response: aiohttp.ClientResponse,
    first_chunk: bytes,
    *,
    stats: StreamStats,
    on_gap: Callable[[float], None],
    on_end: Callable[[StreamStats], None],
    clock: Callable[[], float] = time.monotonic,
    strip_usage: bool = False,
) -> AsyncIterator[bytes]:
    """``strip_usage``: the usage chunk was asked for by the router, not the client."""
    pending = b""
    last_s = clock()
    chunk = first_chunk
    try:
        while chunk:
            pending += chunk
            cut = pending.rfind(_EVENT_END)
            if cut >= 0:
                ready, pending = pending[: cut + 2], pending[cut + 2 :]
                now = clock()
                if stats.first_byte_s is None:
                    stats.first_byte_s = now
                else:
                    on_gap(now - last_s)
                last_s = now
                usage, ready = usage_in_events(ready, strip=strip_usage)
                if usage is not None:
                    stats.usage = usage
                stats.events += ready.count(b"data: ")
                if _DONE in ready:
                    stats.completed = True
                yield ready
                if stats.completed:
                    return
            chunk = await response.content.readany()
        stats.failure = "decode engine closed the stream before [DONE]"
        yield sse_error_event(UpstreamFailed(stats.failure, code="stream_truncated"))
    except asyncio.TimeoutError:
        stats.failure = "decode engine went silent mid-stream"
        yield sse_error_event(UpstreamTimeout(stats.failure, code="stream_idle_timeout"))
    except aiohttp.ClientError as error:
        stats.failure = f"decode engine failed mid-stream: {type(error).__name__}"
        yield sse_error_event(UpstreamFailed(stats.failure, code="stream_broken"))
    finally:
        response.close()
        on_end(stats)
