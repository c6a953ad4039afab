"""``pdserve bench``'s client against a real local HTTP server that ends streams its way."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from benchmarks.client import stream_request
from benchmarks.metrics import error_kind

CHUNK = b'data: {"choices": [{"index": 0, "text": "hi"}]}\n\n'


async def serve(ends_with_done: bool) -> web.AppRunner:
    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(CHUNK + CHUNK)
        if ends_with_done:
            await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.mark.parametrize(("ends_with_done", "ok"), [(True, True), (False, False)])
async def test_a_stream_without_done_is_a_truncated_failure(ends_with_done, ok):
    runner = await serve(ends_with_done)
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            result = await stream_request(
                session, f"http://127.0.0.1:{port}/v1/completions", {"model": "m", "prompt": "x"}
            )
    finally:
        await runner.cleanup()
    assert result.status == 200
    assert result.ok is ok
    assert result.output_tokens == 2
    if not ok:
        assert error_kind(result) == "truncated"
