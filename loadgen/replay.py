"""Open-loop load: send each request at its own time, whether or not earlier ones finished.

Closed-loop clients slow down when the server does, which hides queueing; an
open-loop client keeps the offered rate, so queues build the way they would with
real users. ``max_concurrency`` (vLLM bench's meaning) instead holds a request at
the client until one of that many slots is free; it is timed from its real send.
Bounded: ``max_in_flight`` caps concurrent requests (beyond it a request is
counted as ``client_overload`` and not sent), and ``deadline_s`` stops the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp

from loadgen.client import RequestResult, stream_request


@dataclass(frozen=True, slots=True)
class Scheduled:
    send_at_s: float  # seconds after the run starts
    body: dict
    headers: dict[str, str] | None = None  # this request's own (a tenant's API key)


async def replay(
    url: str,
    schedule: Sequence[Scheduled],
    *,
    max_in_flight: int = 512,
    max_concurrency: int | None = None,
    deadline_s: float = 600.0,
    request_timeout_s: float = 300.0,
    on_result: Callable[[RequestResult], None] = lambda result: None,
    headers: dict[str, str] | None = None,
    send: Callable[..., Awaitable[RequestResult]] = stream_request,
) -> list[RequestResult]:
    """Results in schedule order; unsent requests have status 0 and an error. ``send``
    makes one request (``stream_request``, or ``embed_request`` for embeddings)."""
    results: list[RequestResult | None] = [None] * len(schedule)
    in_flight = 0
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(index: int, item: Scheduled) -> None:
            nonlocal in_flight
            in_flight += 1
            try:
                async with slots:
                    result = await send(session, url, item.body, item.headers or headers)
            finally:
                in_flight -= 1
            result.started_s -= started
            results[index] = result
            on_result(result)

        tasks = []
        for index, item in enumerate(schedule):
            delay = item.send_at_s - (time.perf_counter() - started)
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() - started > deadline_s:
                break
            if in_flight >= max_in_flight:
                results[index] = RequestResult(
                    started_s=time.perf_counter() - started, error="client_overload"
                )
                continue
            tasks.append(asyncio.create_task(one(index, item)))
        remaining = max(0.0, deadline_s - (time.perf_counter() - started))
        _, pending = await asyncio.wait(tasks, timeout=remaining) if tasks else (set(), set())
        for task in pending:
            task.cancel()
    return [r or RequestResult(started_s=0.0, error="deadline") for r in results]
