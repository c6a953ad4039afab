"""Requests for several choices (a list of prompts, ``n`` > 1), served one call per choice.

A KV handoff belongs to one prompt and one sequence, so vLLM's own batching of a
prompt list or of ``n`` samples cannot cross the P/D boundary. The router splits
such a request into single-choice calls (each routed, prefilled and decoded on its
own; a shared prompt is a prefix-cache hit for the later ones) and answers as vLLM
would have:
- choice ``index`` is ``prompt_index * n + sample_index``, vLLM's order;
- usage counts each prompt's tokens once (not once per sample), and every output;
- streamed: the calls' events interleave as they come, under one id; the usage
  chunk, if asked for, and ``data: [DONE]`` come once, at the end;
- sample ``j`` of a seeded request runs with ``seed + j`` (vLLM's parallel sampling),
  and greedy ``n`` > 1 is refused with vLLM's message;
- any call that fails fails the whole request (the others are cancelled, so their
  engines abort and free their KV), as vLLM fails a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response, StreamingResponse

from router.errors import InvalidRequest
from router.orchestration.relay import SSE_HEADERS

_EVENT_END = b"\n\n"
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature is greedy


@dataclass(frozen=True, slots=True)
class Choice:
    body: dict[str, Any]
    counts_prompt: bool  # the first sample of its prompt: its prompt tokens count in usage


def split_choices(body: dict[str, Any], *, chat: bool, max_choices: int) -> list[Choice] | None:
    """One body per choice, or None when the request asks for one choice only."""
    prompts = [None] if chat else _prompts(body.get("prompt"))
    n = body.get("n") or 1
    if not isinstance(n, int) or isinstance(n, bool):
        return None  # the validated model rejects it first; never reached from the API
    if len(prompts) * n == 1:
        only = prompts[0]
        if not chat and only is not body.get("prompt"):
            return [Choice({**body, "prompt": only}, True)]  # [[ids]] or ["text"]: unwrap
        return None
    temperature = body.get("temperature")
    if n > 1 and isinstance(temperature, int | float) and temperature < GREEDY_BELOW:
        raise InvalidRequest(f"n must be 1 when using greedy sampling, got {n}.", param="n")
    if len(prompts) * n > max_choices:
        raise InvalidRequest(
            f"{len(prompts)} prompt(s) x n={n} asks for {len(prompts) * n} choices; "
            f"at most {max_choices} per request", param="n" if n > 1 else "prompt",
        )  # fmt: skip
    choices = []
    for prompt in prompts:
        for sample in range(n):
            sub = {**body, "n": 1}
            if isinstance(body.get("seed"), int) and sample:
                sub["seed"] = body["seed"] + sample
            if not chat:
                sub["prompt"] = prompt
            choices.append(Choice(sub, counts_prompt=sample == 0))
    return choices


def _prompts(prompt: Any) -> list[Any]:
    """A completions ``prompt`` as its list of single prompts (vLLM's batching rules)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return list(prompt)
    return [prompt]


Serve = Callable[[dict[str, Any], bool], Awaitable[Response]]  # (body, counts_prompt)


async def serve_choices(
    choices: Sequence[Choice], serve: Serve, *, stream: bool, include_usage: bool
) -> Response:
    if len(choices) == 1:
        return await serve(choices[0].body, True)
    if not stream:
        responses = await _all_or_nothing([serve(c.body, c.counts_prompt) for c in choices])
        return _merged_whole([json.loads(bytes(r.body)) for r in responses], choices)
    bodies = [
        {**c.body, "stream_options": {**(c.body.get("stream_options") or {}),
                                      "include_usage": True}}
        for c in choices
    ]  # fmt: skip
    responses = await _all_or_nothing(
        [serve(b, c.counts_prompt) for b, c in zip(bodies, choices, strict=True)]
    )
    streams = [r.body_iterator for r in responses if isinstance(r, StreamingResponse)]
    merged = _merged_stream(streams, choices, include_usage)
    return StreamingResponse(merged, media_type="text/event-stream", headers=SSE_HEADERS)


async def _all_or_nothing(calls: list[Awaitable[Response]]) -> list[Response]:
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                response = await task
                if isinstance(response, StreamingResponse):
                    await _discard(response.body_iterator)
        raise


def _merged_whole(payloads: list[dict[str, Any]], choices: Sequence[Choice]) -> Response:
    merged = dict(payloads[0])
    merged["choices"] = [
        {**payload["choices"][0], "index": index} for index, payload in enumerate(payloads)
    ]
    merged["usage"] = _usage([p.get("usage") for p in payloads], choices)
    return Response(content=json.dumps(merged), media_type="application/json")


def _usage(usages: list[dict[str, Any] | None], choices: Sequence[Choice]) -> dict[str, Any]:
    prompt = sum((u or {}).get("prompt_tokens", 0)
                 for u, c in zip(usages, choices, strict=True) if c.counts_prompt)  # fmt: skip
    completion = sum((u or {}).get("completion_tokens", 0) for u in usages)
    # The engine's other usage fields (prompt_tokens_details, ...) as its first answer has them.
    return {**(usages[0] or {}), "prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion}  # fmt: skip


async def _merged_stream(
    streams: list[AsyncIterator[bytes]], choices: Sequence[Choice], include_usage: bool
) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[bytes]) -> None:
        try:
            async for chunk in stream:
                await queue.put((index, chunk))
        finally:
            await queue.put((index, None))

    pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    usages: list[dict[str, Any] | None] = [None] * len(streams)
    last: dict[str, Any] = {}  # the shared id, created and model, from the first chunk
    open_streams = len(streams)
    try:
        while open_streams:
            index, chunk = await queue.get()
            if chunk is None:
                open_streams -= 1
                continue
            for event in chunk.split(_EVENT_END):
                if not event.strip():
                    continue
                if not event.startswith(b"data: "):
                    yield event + _EVENT_END  # an error event: the stream ends with it
                    return
                data = event[6:].strip()
                if data == b"[DONE]":
                    continue
                payload = json.loads(data)
                if payload.get("usage") and not payload.get("choices"):
                    usages[index] = payload["usage"]
                    continue
                if not last:
                    last = {k: payload.get(k) for k in ("id", "created", "model", "object")}
                payload.update(last)
                payload.pop("usage", None)
                for choice in payload.get("choices") or ():
                    choice["index"] = index
                yield b"data: " + json.dumps(payload).encode() + _EVENT_END
        if include_usage:
            usage = {**last, "choices": [], "usage": _usage(usages, choices)}
            yield b"data: " + json.dumps(usage).encode() + _EVENT_END
        yield b"data: [DONE]" + _EVENT_END
    finally:
        # Cancelling a pump ends its relay inside its await, so the relay's own cleanup
        # runs: the engine response closes (vLLM aborts) and the load count drops.
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _discard(stream: AsyncIterator[bytes]) -> None:
    """End a relay that nobody iterated. Closing an unstarted async generator skips its
    ``finally``, so start it, then cancel it at its first wait."""

    async def drain() -> None:
        async for _ in stream:
            pass

    task = asyncio.ensure_future(drain())
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
