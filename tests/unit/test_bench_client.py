"""``pdserve bench``'s client against a real local HTTP server that ends streams its way."""

from __future__ import annotations

import functools

import aiohttp
import pytest
from aiohttp import web

from loadgen.client import embed_request, stream_request
from loadgen.metrics import error_kind
from tests.completions_server import completions_server

CHUNK = b'data: {"choices": [{"index": 0, "text": "hi"}]}\n\n'


async def completions(request: web.Request, ends_with_done: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(CHUNK + CHUNK)
    if ends_with_done:
        await response.write(b"data: [DONE]\n\n")
    return response


@pytest.mark.parametrize(("ends_with_done", "ok"), [(True, True), (False, False)])
async def test_a_stream_without_done_is_a_truncated_failure(ends_with_done, ok):
    handler = functools.partial(completions, ends_with_done=ends_with_done)
    async with completions_server(handler) as url, aiohttp.ClientSession() as session:
        result = await stream_request(
            session, url + "/v1/completions", {"model": "m", "prompt": "x"}
        )
    assert result.status == 200
    assert result.ok is ok
    assert result.output_tokens == 2
    if not ok:
        assert error_kind(result) == "truncated"


async def embeddings(request: web.Request, vectors: int) -> web.Response:
    data = [{"object": "embedding", "index": i, "embedding": [0.5, 0.5]} for i in range(vectors)]
    return web.json_response({"data": data, "usage": {"prompt_tokens": 7, "total_tokens": 7}})


@pytest.mark.parametrize(("vectors", "ok"), [(3, True), (2, False)])
async def test_an_embedding_answer_needs_one_vector_per_input(vectors, ok):
    handler = functools.partial(embeddings, vectors=vectors)
    async with (
        completions_server(handler, "/v1/embeddings") as url,
        aiohttp.ClientSession() as session,
    ):
        result = await embed_request(
            session, url + "/v1/embeddings", {"model": "m", "input": ["a", "b", "c"]}
        )
    assert result.status == 200
    assert result.ok is ok
    assert result.prompt_tokens == 7
    assert result.ttft_s is None and result.e2e_s > 0
    if not ok:
        assert error_kind(result) == "bad_answer"
