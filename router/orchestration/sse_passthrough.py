"""Streamed answers written from the engine connection straight to the client's socket.

The response start goes through the ASGI chain as usual (middleware adds its headers).
Then, on uvicorn's httptools server with chunked encoding, each run of whole events is
written to the client's transport from the engine connection's callback
(``engine_client.py``): no task switch and no ASGI message per event. The closing chunk
goes through ASGI again, so uvicorn ends the response as it would have. Anywhere else
(another server, a response whose events a wrapper reads: fan-out, safety screen), the
same ``SSERelay`` runs as an async iterator.

Middleware between the server and this response sees the response start and the end,
not the events in between. None of the router's middleware reads bodies; one that must
would have to replace ``body_iterator``, which turns the pass-through off.

Backpressure: while uvicorn has paused writing to a slow client, the engine connection
stops reading, so TCP holds the engine back instead of the router buffering its tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi.responses import StreamingResponse

from contracts.asgi import ASGIApp, Receive, Scope, Send
from router.orchestration.engine_client import EngineConnection
from router.orchestration.engine_errors import EngineAborted
from router.orchestration.relay import Resume, SSERelay, StreamStats, no_resume, relay_sse

_CLIENT_SOCKET = "pdserve.client_socket"  # the scope key ClientSockets sets
_UVICORN_CYCLE = ("uvicorn.protocols.http.httptools_impl", "RequestResponseCycle")


class ClientSockets:
    """The outermost ASGI layer: lets a streamed answer reach uvicorn's connection.

    uvicorn's ``send`` is a method of its per-request cycle, which holds the socket's
    transport and flow control. Put in the scope only when it is that server's cycle.
    """

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            cycle = getattr(send, "__self__", None)
            kind = type(cycle)
            if (kind.__module__, kind.__name__) == _UVICORN_CYCLE:
                scope[_CLIENT_SOCKET] = cycle
        await self._app(scope, receive, send)


class EngineSSEResponse(StreamingResponse):
    def __init__(
        self,
        connection: EngineConnection,
        first_chunk: bytes,
        relay: SSERelay,
        *,
        on_end: Callable[[StreamStats], None],
        headers: dict[str, str],
        resume: Resume = no_resume,
    ) -> None:
        self._connection, self._first_chunk, self._relay = connection, first_chunk, relay
        self._on_end, self._resume = on_end, resume
        self.passed_through = False  # whether events went straight to the socket
        self._events = relay_sse(connection, first_chunk, relay, on_end=on_end, resume=resume)
        super().__init__(self._events, media_type="text/event-stream", headers=headers)

    @property
    def stats(self) -> StreamStats:
        return self._relay.stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]
        cycle = scope.get(_CLIENT_SOCKET)
        if cycle is None or self.body_iterator is not self._events:
            await super().__call__(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})  # fmt: skip
        if cycle.disconnected:  # gone while the answer was prepared
            await self._events.aclose()
            self._connection.abort()
            self._on_end(self._relay.stats)
            return
        if cycle.chunked_encoding is not True:  # e.g. a HEAD request: uvicorn's rules apply
            async for events in self._events:
                await send({"type": "http.response.body", "body": events, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await self._events.aclose()  # never started: nothing in it ran
        self.passed_through = True
        try:
            tail = await _pass_through(cycle, receive, self._connection, self._first_chunk,
                                       self._relay, self._resume)  # fmt: skip
        finally:
            self._on_end(self._relay.stats)
        if tail is not None:
            await send({"type": "http.response.body", "body": tail, "more_body": False})


_CLIENT_GONE = object()
_ENDED_EARLY = object()


class _Passage:
    """One stream's way from the engine connection's callback to the client's socket."""

    def __init__(self, cycle: Any, connection: EngineConnection, relay: SSERelay) -> None:
        self._loop = asyncio.get_running_loop()
        self.outcome: asyncio.Future[object] = self._loop.create_future()
        self._cycle, self._connection, self._relay = cycle, connection, relay
        self._transport, self._flow = cycle.transport, cycle.flow
        self._draining: asyncio.Task[None] | None = None

    def settle(self, result: object) -> None:
        if not self.outcome.done():
            self.outcome.set_result(result)

    def sink(self, chunk: bytes) -> bool:
        """Forward the whole events ``chunk`` completes; False while the client is behind."""
        relay = self._relay
        if relay.stats.completed:
            return True  # the engine's closing bytes
        if self._cycle.disconnected:
            self.settle(_CLIENT_GONE)
            return False
        try:
            ready = relay.feed(chunk)
        except Exception as error:  # the relay's edit refused the events
            self.settle(error)
            return False
        if ready:
            self._transport.write(b"%x\r\n%b\r\n" % (len(ready), ready))
            if relay.stats.completed:
                self.settle(None)
        if relay.aborted:
            self.settle(EngineAborted())
            return False
        if self._flow.write_paused:
            if self._draining is None:
                self._draining = self._loop.create_task(self._resume_when_drained())
            return False
        return True

    def ended(self, error: BaseException | None) -> None:
        self.settle(_ENDED_EARLY if error is None else error)

    async def _resume_when_drained(self) -> None:
        await self._flow.drain()
        self._draining = None
        self._connection.resume()

    def stop_draining(self) -> None:
        if self._draining is not None:
            self._draining.cancel()


async def _pass_through(
    cycle: Any,
    receive: Receive,
    connection: EngineConnection,
    first: bytes,
    relay: SSERelay,
    resume: Resume,
) -> bytes | None:
    """Relay until ``[DONE]``, a failure or the client leaving, going on from another
    engine when ``resume`` offers one; the last body to send through ASGI (``None``: the
    client is gone). Every connection used is finished or closed."""
    passages: list[_Passage] = []
    watcher = asyncio.ensure_future(_until_disconnected(receive))
    watcher.add_done_callback(lambda _: passages[-1].settle(_CLIENT_GONE) if passages else None)
    try:
        while True:
            passage = _Passage(cycle, connection, relay)
            passages.append(passage)
            if watcher.done():
                passage.settle(_CLIENT_GONE)
            result = await _passage_outcome(passage, connection, first)
            if result is None:
                connection.finish()
                return b""
            connection.abort()
            if result is _CLIENT_GONE:
                return None
            error = None if result is _ENDED_EARLY else result
            resumed = await resume(error)  # type: ignore[arg-type]
            if resumed is None:
                return relay.failed(error)  # type: ignore[arg-type]
            relay.switched_engine()
            connection, first = resumed
    finally:
        watcher.cancel()


async def _passage_outcome(passage: _Passage, connection: EngineConnection, first: bytes) -> object:
    try:
        keep_reading = passage.sink(first)
        connection.push_to(passage.sink, passage.ended)
        if not keep_reading:
            connection.pause()
        return await passage.outcome
    except BaseException:
        connection.abort()
        raise
    finally:
        passage.stop_draining()


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
