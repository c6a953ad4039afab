"""The router's engine client and its streamed relay, between a real engine-like HTTP
server and a real uvicorn front door.

The engine is an aiohttp.web server that streams SSE the way vLLM does (chunked, one
write per event, ``data: [DONE]`` last) and records what it saw: connections, aborts.
The front door is uvicorn (httptools) serving ``EngineSSEResponse`` behind
``ClientSockets``, as ``pdserve router`` does. A real aiohttp client reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
import uvicorn
from aiohttp import web

from localrun.ports import free_ports
from router.orchestration.engine_client import EngineClient
from router.orchestration.engine_errors import EngineHTTPError, EngineNotReached, EngineUnreachable
from router.orchestration.relay import SSERelay, StreamStats
from router.orchestration.sse_passthrough import ClientSockets, EngineSSEResponse
from tests.conditions import until


def event(i: int, last: bool = False) -> bytes:
    """A completion chunk; the last one ends the choice, as vLLM's does."""
    finish = b'"length"' if last else b"null"
    return b'data: {"choices":[{"index":0,"text":" t%d","finish_reason":%b}]}\n\n' % (i, finish)


class Engine:
    """An SSE engine on a free port, with a record of its connections and aborts."""

    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []
        self.aborted = asyncio.Event()
        self.finished = 0
        self.drop_reused = False
        self.written = 0  # events written by the engine so far

    async def stream(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername")
        if self.drop_reused and peer in self.peers:
            request.transport.close()  # a keep-alive connection the engine gave up on
            raise asyncio.CancelledError
        self.peers.append(peer)
        await request.read()
        q = request.query
        n, gap_s = int(q.get("n", "5")), float(q.get("gap_ms", "0")) / 1000
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            pad = b" " * int(q.get("pad", "0"))
            for i in range(n):
                data = event(i, last=i == n - 1)
                data = data[:-2] + pad + b"\n\n" if pad else data
                if q.get("split"):  # an event across two writes (and two TCP segments)
                    await response.write(data[:7])
                    await asyncio.sleep(0.005)
                    data = data[7:]
                await response.write(data)
                self.written += 1
                if gap_s:
                    await asyncio.sleep(gap_s)
            if q.get("hang"):
                await asyncio.sleep(3600)
            if not q.get("truncate"):
                await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted.set()
            raise
        await response.write_eof()
        self.finished += 1
        return response

    async def whole(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport.get_extra_info("peername"))
        await asyncio.sleep(float(request.query.get("delay_s", "0")))
        size = int(request.query.get("size", "10"))
        return web.json_response({"text": "x" * size})

    async def refuse(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport.get_extra_info("peername"))
        return web.json_response({"error": {"message": "no"}}, status=400)


@dataclass
class Setup:
    engine: Engine
    engine_url: str
    url: str  # the front door's streamed route
    engines: EngineClient
    responses: list[EngineSSEResponse] = field(default_factory=list)


@contextlib.asynccontextmanager
async def engine_and_router(
    idle_timeout_s: float = 5.0, wrap: Callable[[EngineSSEResponse], None] | None = None
) -> AsyncIterator[Setup]:
    engine = Engine()
    app = web.Application()
    app.router.add_post("/v1/completions", engine.stream)
    app.router.add_post("/refuse", engine.refuse)
    app.router.add_post("/whole", engine.whole)
    engine_port, router_port = free_ports(2)
    runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True)  # as vLLM aborts
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", engine_port).start()
    engines = EngineClient(pool_size=8, connect_timeout_s=2.0, keepalive_s=30.0)
    setup = Setup(
        engine, f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{router_port}/", engines
    )

    async def front(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        url = f"{setup.engine_url}/v1/completions?{scope['query_string'].decode()}"
        connection, first = await engines.open_stream(
            url, b"{}", first_byte_timeout_s=2.0, idle_timeout_s=idle_timeout_s
        )
        relay = SSERelay(StreamStats(started_s=0.0), on_gap=lambda _: None)
        response = EngineSSEResponse(connection, first, relay, on_end=lambda _: None, headers={})
        if wrap is not None:
            wrap(response)
        setup.responses.append(response)
        await response(scope, receive, send)

    config = uvicorn.Config(
        ClientSockets(front), host="127.0.0.1", port=router_port, http="httptools",
        lifespan="off", log_level="warning",
    )  # fmt: skip
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    await until(lambda: server.started, 10, "the front door to start")
    try:
        yield setup
    finally:
        server.should_exit = True
        await serving
        engines.close()
        await runner.cleanup()


async def read_chunks(url: str) -> list[bytes]:
    """The HTTP chunks of a streamed answer, as the client received them."""
    chunks, piece = [], b""
    async with aiohttp.ClientSession() as client, client.post(url, data=b"{}") as answer:
        assert answer.status == 200
        async for data, end_of_chunk in answer.content.iter_chunks():
            piece += data
            if end_of_chunk:
                chunks.append(piece)
                piece = b""
    return chunks


async def test_events_go_straight_to_the_client_and_the_connection_is_kept():
    async with engine_and_router() as setup:
        chunks = await read_chunks(setup.url + "?n=20")
        sent = b"".join(event(i, last=i == 19) for i in range(20))
        assert b"".join(chunks) == sent + b"data: [DONE]\n\n"
        (response,) = setup.responses
        assert response.passed_through
        stats = response.stats
        assert stats.completed and stats.events == 21 and stats.failure is None
        await until(lambda: setup.engines.idle_connections == 1, 5, "a pooled connection")
        await read_chunks(setup.url + "?n=3")
        peers = setup.engine.peers
        assert len(peers) == 2 and peers[0] == peers[1]  # the same keep-alive connection


async def test_an_event_split_across_reads_reaches_the_client_whole():
    async with engine_and_router() as setup:
        chunks = await read_chunks(setup.url + "?n=6&split=1")
        assert setup.responses[0].passed_through
        assert all(chunk.endswith(b"\n\n") for chunk in chunks), chunks
        assert b"".join(chunks).count(b"data: ") == 7


async def test_a_stream_cut_before_done_ends_in_an_error_event_and_is_not_pooled():
    async with engine_and_router() as setup:
        body = b"".join(await read_chunks(setup.url + "?n=3&truncate=1"))
        assert body.startswith(event(0) + event(1) + event(2, last=True))
        error = json.loads(body.split(b"event: error\ndata: ")[1])
        assert error["error"]["code"] == "stream_truncated"
        assert setup.responses[0].stats.failure is not None
        await until(lambda: setup.engines.open_connections == 0, 5, "the connection closed")


async def test_a_silent_engine_is_failed_after_the_idle_timeout_and_aborted():
    async with engine_and_router(idle_timeout_s=0.3) as setup:
        body = b"".join(await read_chunks(setup.url + "?n=2&hang=1"))
        error = json.loads(body.split(b"event: error\ndata: ")[1])
        assert error["error"]["code"] == "stream_idle_timeout"
        await asyncio.wait_for(setup.engine.aborted.wait(), 5)


async def test_failing_the_calls_to_an_engine_ends_its_streams_now_not_at_the_idle_timeout():
    """What the router does when a worker's health probes eject it (a hung engine)."""
    async with engine_and_router(idle_timeout_s=60) as setup:
        reading = asyncio.ensure_future(read_chunks(setup.url + "?n=2&hang=1"))
        await until(lambda: setup.engine.written == 2, 5, "the stream to start")
        assert setup.engines.fail_calls_to(setup.engine_url, "ejected") == 1
        body = b"".join(await asyncio.wait_for(reading, 5))
        error = json.loads(body.split(b"event: error\ndata: ")[1])
        assert error["error"]["code"] == "stream_broken"
        await asyncio.wait_for(setup.engine.aborted.wait(), 5)
        assert setup.engines.fail_calls_to(setup.engine_url, "ejected") == 0


async def test_a_stream_silent_past_the_stall_time_is_reported_once_per_silence():
    """The router's fast hang check starts here (``health.StallCheck``): a silence is
    told once, with the engine's address, and a stream that keeps talking is never told."""
    async with engine_and_router(idle_timeout_s=60) as setup:
        told: list[tuple[str, int]] = []
        setup.engines.watch_stalls(0.2, told.append)
        await read_chunks(setup.url + "?n=30&gap_ms=20")  # 20 ms between events: never
        assert told == []
        reading = asyncio.ensure_future(read_chunks(setup.url + "?n=2&hang=1"))
        await until(lambda: len(told) == 1, 5, "the silence to be told")
        port = int(setup.engine_url.rsplit(":", 1)[1])
        assert told == [("127.0.0.1", port)]
        await asyncio.sleep(0.5)  # more than twice the stall time: still the same silence
        assert len(told) == 1
        setup.engines.fail_calls_to(setup.engine_url, "ejected")
        await asyncio.wait_for(reading, 5)


async def test_a_late_first_byte_is_reported_and_the_call_failed_then_counts_as_sent():
    """A hung engine's newest call waits for its first byte: that silence is told too, and
    the call that ``fail_calls_to`` then ends was sent, so it may have been acted on."""
    async with engine_and_router() as setup:
        told: list[tuple[str, int]] = []
        setup.engines.watch_stalls(0.2, told.append)
        calling = asyncio.ensure_future(
            setup.engines.post_json(setup.engine_url + "/whole?delay_s=30", b"{}", timeout_s=30)
        )
        await until(lambda: len(told) == 1, 5, "the late first byte to be told")
        assert setup.engines.fail_calls_to(setup.engine_url, "ejected") == 1
        with pytest.raises(EngineUnreachable) as failed:
            await asyncio.wait_for(calling, 5)
        assert not isinstance(failed.value, EngineNotReached)


async def test_a_client_that_leaves_mid_stream_aborts_the_engine_request():
    async with engine_and_router() as setup:
        async with aiohttp.ClientSession() as client:
            answer = await client.post(setup.url + "?n=1000&gap_ms=10", data=b"{}")
            await answer.content.readuntil(b"\n\n")
            answer.close()
        await asyncio.wait_for(setup.engine.aborted.wait(), 5)
        await until(lambda: setup.engines.open_connections == 0, 5, "the connection closed")
        assert setup.engine.finished == 0


async def test_a_wrapper_that_reads_the_events_gets_them_all():
    def wrap(response: EngineSSEResponse) -> None:
        async def passed_on(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            async for piece in events:
                yield piece

        response.body_iterator = passed_on(response.body_iterator)

    async with engine_and_router(wrap=wrap) as setup:
        body = b"".join(await read_chunks(setup.url + "?n=10&split=1"))
        assert body.count(b"data: ") == 11 and body.endswith(b"data: [DONE]\n\n")
        assert not setup.responses[0].passed_through
        await until(lambda: setup.engines.idle_connections == 1, 5, "a pooled connection")


async def test_a_refusal_is_an_http_error_with_the_engines_body_and_the_connection_kept():
    async with engine_and_router() as setup:
        with pytest.raises(EngineHTTPError) as refused:
            await setup.engines.open_stream(setup.engine_url + "/refuse", b"{}",
                                     first_byte_timeout_s=2, idle_timeout_s=2)  # fmt: skip
        assert refused.value.status == 400 and b"no" in refused.value.body
        assert setup.engines.idle_connections == 1


async def test_a_reused_connection_the_engine_dropped_is_retried_once_on_a_new_one():
    async with engine_and_router() as setup:
        await read_chunks(setup.url + "?n=2")
        await until(lambda: setup.engines.idle_connections == 1, 5, "a pooled connection")
        setup.engine.drop_reused = True
        body = b"".join(await read_chunks(setup.url + "?n=2"))
        assert body.endswith(b"data: [DONE]\n\n")
        peers = setup.engine.peers
        assert len(peers) == 2 and peers[0] != peers[1]


async def test_an_engine_that_is_not_listening_is_not_reached():
    """Only here may a decode's KV handoff go on to another decode: nothing got there."""
    (port,) = free_ports(1)
    engines = EngineClient(pool_size=2, connect_timeout_s=1.0, keepalive_s=30.0)
    with pytest.raises(EngineNotReached):
        await engines.open_stream(f"http://127.0.0.1:{port}/v1/completions", b"{}",
                           first_byte_timeout_s=1, idle_timeout_s=1)  # fmt: skip
    assert engines.open_connections == 0


async def test_a_client_that_stops_reading_holds_the_engine_back():
    """64 MB of events against a client that reads one, then stops: the engine must get
    stuck far short of the end (TCP backpressure through the router), and the client must
    still get every event, whole, once it reads on."""
    n, pad = 32_000, 2_000
    async with engine_and_router() as setup:
        async with aiohttp.ClientSession() as client:
            answer = await client.post(setup.url + f"?n={n}&pad={pad}", data=b"{}")
            await answer.content.readuntil(b"\n\n")
            engine = setup.engine
            seen = {"count": -1, "since": asyncio.get_running_loop().time()}

            def engine_stalled() -> bool:
                now = asyncio.get_running_loop().time()
                if engine.written != seen["count"]:
                    seen.update(count=engine.written, since=now)
                return now - seen["since"] > 0.5

            await until(engine_stalled, 20, "the engine to stop making progress")
            assert engine.written < n // 2, engine.written
            rest = await answer.read()
        assert rest.count(b"data: ") == n  # the other n - 1 events and [DONE]
        assert rest.endswith(b"data: [DONE]\n\n")
        assert setup.responses[0].passed_through


async def test_a_whole_answer_is_read_whole_over_one_kept_connection():
    async with engine_and_router() as setup:
        for size in (10, 3_000_000):  # one read, then many
            answer = await setup.engines.post_json(
                setup.engine_url + f"/whole?size={size}", b"{}", timeout_s=5
            )
            assert json.loads(answer) == {"text": "x" * size}
        peers = setup.engine.peers
        assert len(peers) == 2 and peers[0] == peers[1]
        assert setup.engines.idle_connections == 1


async def test_a_whole_answer_past_its_timeout_is_unreachable_and_aborted():
    async with engine_and_router() as setup:
        with pytest.raises(EngineUnreachable, match=r"within 0\.3 s") as late:
            await setup.engines.post_json(setup.engine_url + "/whole?delay_s=5", b"{}",
                                          timeout_s=0.3)  # fmt: skip
        # Sent, then unanswered: the engine may have acted on it (pulled a handoff's KV).
        assert not isinstance(late.value, EngineNotReached)
        assert setup.engines.open_connections == 0
        with pytest.raises(EngineHTTPError) as refused:
            await setup.engines.post_json(setup.engine_url + "/refuse", b"{}", timeout_s=5)
        assert refused.value.status == 400


async def test_a_client_that_takes_nothing_for_the_idle_timeout_has_its_engine_request_aborted():
    async with engine_and_router(idle_timeout_s=0.5) as setup:
        async with aiohttp.ClientSession() as client:
            answer = await client.post(setup.url + "?n=32000&pad=2000", data=b"{}")
            await answer.content.readuntil(b"\n\n")
            await asyncio.wait_for(setup.engine.aborted.wait(), 10)
            answer.close()
        assert setup.engine.written < 32_000
        assert setup.responses[0].stats.failure is not None
