"""The router's calls to worker engines: a small HTTP/1.1 client of its own.

Why not aiohttp (``upstream.py``, kept for health probes and safety hooks): aiohttp hands
each chunk to a StreamReader and wakes the task awaiting it, a task switch per SSE event,
and builds a request object, header maps and timers per call. Here the bytes arrive in a
protocol callback (httptools parses the framing) that can hand whole events straight to
the client's socket (``sse_passthrough.py``). The CPU this saves per request and per
relayed token is in ``benchmarks/results/router_cpu.md``. A consumer that wants an async
iterator instead (a fan-out, a safety screen) calls ``read()``.

Invariants:
- One request per connection at a time. A connection goes back to the idle pool only
  after its answer ended cleanly and the engine allowed keep-alive, and is not reused
  past ``keepalive_s``. At most ``pool_size`` connections are open, idle ones included;
  past that an idle one is closed to make room, or a call waits for one up to the
  connect timeout (aiohttp's rule).
- A request that fails on a reused connection before any answer byte never reached the
  engine (vLLM's uvicorn closes idle connections first), so it is sent once more on a
  fresh connection.
- Reading pauses while a reader is more than ``_HIGH_WATER_BYTES`` behind, or while a
  sink says so: a slow client holds back the engine, not the router's memory. An error
  body is read up to ``_ERROR_BODY_BYTES``, a whole answer up to ``_WHOLE_ANSWER_BYTES``.
- A stream silent for ``idle_timeout_s`` fails with ``StreamIdle``; one paused that
  long because its reader took nothing fails with ``StreamBroken``. Closing the
  connection (``abort``) is what makes vLLM abort the request and free its KV blocks.
- A stream whose engine has been silent for ``stall_after_s`` (not one paused by its
  reader), or a call whose first byte is that late, is reported to ``on_stall`` once per
  silence, with the engine's address: a hung engine is suspected in a second, not after
  its health probes' slow majority vote.
- ``EngineNotReached`` only where no connection carried the request: a request that was
  sent and then failed may have been acted on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import SplitResult, urlsplit

import httptools

from contracts.logs import REQUEST_ID_HEADER, request_id_var
from router.orchestration.engine_errors import EngineHTTPError, EngineNotReached, EngineUnreachable

_HIGH_WATER_BYTES = 256 * 1024
_ERROR_BODY_BYTES = 1024 * 1024
_WHOLE_ANSWER_BYTES = 256 * 1024 * 1024  # n choices with logprobs of a long output fit
_END_GRACE_S = 2.0  # after [DONE], how long the rest of the answer may take to be pooled

Sink = Callable[[bytes], bool]  # takes answer bytes; False asks to pause reading
Ended = Callable[["BaseException | None"], None]  # None: the answer ended cleanly
StallReport = Callable[[tuple[str, int]], None]  # an engine's address


class StreamIdle(Exception):
    """The engine sent nothing for the idle timeout."""


class StreamBroken(Exception):
    """The connection failed or closed before the answer ended."""


class _Stale(Exception):
    """A reused connection closed before any answer byte: the request never got there."""


class EngineConnection(asyncio.Protocol):
    """One keep-alive connection to an engine; a streamed answer's handle while it runs."""

    def __init__(self, pool: EngineClient, address: tuple[str, int]) -> None:
        self._pool = pool
        self.address = address
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since_s = 0.0
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self._got_bytes = False
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._error_body = bytearray()
        self._ended = False
        self._keep_alive = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self._on_ended: Ended | None = None
        self._paused = False
        self._done_with = False  # the consumer has what it wanted
        self._idle_timeout_s = 0.0
        self._last_data_s = 0.0
        self._stall_told_s = -1.0  # the _last_data_s of the silence last reported
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        self._last_data_s = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(StreamBroken(f"unparsable answer from the engine: {error}"))
        except Exception as error:  # a sink's bug must not leave the stream hanging
            self._fail(StreamBroken(f"relay failed: {error!r}"))

    def eof_received(self) -> bool:
        return False  # close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._ended:
            return
        if self.reused and not self._got_bytes:
            self._fail(_Stale())
        else:
            self._fail(StreamBroken(f"engine closed the connection mid-answer ({exc!r})"))

    # -- httptools callbacks ------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            if len(self._error_body) < _ERROR_BODY_BYTES:
                self._error_body += body[: _ERROR_BODY_BYTES - len(self._error_body)]
            return
        if self._sink is not None:
            if not self._sink(body):
                self.pause()
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER_BYTES:
            self.pause()
        self._wake()

    def on_message_complete(self) -> None:
        self._ended = True
        self._keep_alive = self._parser.should_keep_alive()
        self._cancel_timer()
        self._wake()
        if self._on_ended is not None:
            self._on_ended(None)
        if self._done_with:
            self._give_back()

    # -- the request ----------------------------------------------------------------------

    async def send(self, request: bytes, *, first_byte_timeout_s: float) -> bytes:
        """Write the request; return the answer's first bytes once they are here.

        Raises ``EngineHTTPError`` for a non-200 answer (read whole), ``_Stale`` for a
        reused connection closed unanswered, ``EngineUnreachable`` otherwise.
        """
        assert self._transport is not None
        self._transport.write(request)
        now_s = self._loop.time()
        deadline_s = now_s + first_byte_timeout_s
        # A first byte that is late is a silence too (a hung engine's newest requests
        # wait there): reported once, like a stream's.
        stall_s = now_s + self._pool.stall_after_s if self._pool.stall_after_s else None
        while not (self._chunks or self._ended or self._error):
            now_s = self._loop.time()
            left_s = deadline_s - now_s
            if left_s <= 0:
                self.abort()
                raise EngineUnreachable(f"no answer within {first_byte_timeout_s:.1f} s")
            if stall_s is not None and now_s >= stall_s:
                stall_s = None
                self._pool.stalled(self.address)
            self._waiter = self._loop.create_future()
            try:
                await asyncio.wait_for(
                    self._waiter, left_s if stall_s is None else min(left_s, stall_s - now_s)
                )
            except asyncio.TimeoutError:
                continue
            except BaseException:
                self.abort()
                raise
            finally:
                self._waiter = None
        if self._error is not None:
            if isinstance(self._error, _Stale):
                raise self._error
            raise EngineUnreachable(str(self._error))
        if self.status != 200:
            error = EngineHTTPError(self.status, bytes(self._error_body))
            self.finish()
            raise error
        if not self._chunks:
            self.finish()
            raise EngineUnreachable("stream closed before its first byte")
        return self._take()

    def watch_idle(self, idle_timeout_s: float) -> None:
        self._idle_timeout_s = idle_timeout_s
        self._timer = self._loop.call_later(self._next_check_s(0.0), self._check_idle)

    async def read(self) -> bytes:
        """The answer's next bytes; ``b""`` once it ended cleanly."""
        while True:
            if self._chunks:
                return self._take()
            if self._error is not None:
                raise self._error
            if self._ended:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def push_to(self, sink: Sink, on_ended: Ended) -> None:
        """From now on, hand each piece of the answer to ``sink`` as it arrives, and say
        how the answer ended to ``on_ended`` (once)."""
        self._sink, self._on_ended = sink, on_ended
        if self._chunks and not sink(self._take()):
            self.pause()
        if self._error is not None:
            on_ended(self._error)
        elif self._ended:
            on_ended(None)

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._last_data_s = self._loop.time()
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None and not self.closed:
            self._paused = False
            self._last_data_s = self._loop.time()
            self._transport.resume_reading()

    def finish(self) -> None:
        """The consumer is done. A cleanly ended answer pools the connection; one still
        running gets a short grace to end (the engine's last chunk follows ``[DONE]``)."""
        self._done_with = True
        self._sink = self._on_ended = None
        if self._ended and self._error is None:
            self._give_back()
        elif self._error is not None or self.closed:
            self.abort()
        else:
            self.resume()
            self._cancel_timer()
            self._timer = self._loop.call_later(_END_GRACE_S, self.abort)

    def abort(self) -> None:
        """Close the connection: the engine aborts the request it was answering."""
        self._cancel_timer()
        self._done_with = True
        self._sink = self._on_ended = None
        if self._transport is not None and not self.closed:
            self.closed = True
            self._transport.close()
        self._pool.forget(self)

    # -- internals ------------------------------------------------------------------------

    def _take(self) -> bytes:
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self._sink is None:
            self.resume()
        return data

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is not None or self._ended:
            return
        self._error = error
        self._cancel_timer()
        self._wake()
        on_ended = self._on_ended
        if on_ended is not None:
            self._on_ended = None
            on_ended(error)
        if self._transport is not None and not self.closed:
            self.closed = True
            self._transport.close()

    def _check_idle(self) -> None:
        """The engine silent, or the reader (a client) taking nothing, for the idle
        timeout: either way the stream is failed and the engine's request aborted.
        An engine silent for the pool's stall time is reported first, once per silence."""
        self._timer = None
        if self._ended or self._error is not None or self.closed:
            return
        # While paused, _last_data_s is when reading paused: the reader's silence counts.
        silent_s = self._loop.time() - self._last_data_s
        stall_after_s = self._pool.stall_after_s
        if (
            stall_after_s
            and not self._paused
            and silent_s >= stall_after_s
            and self._stall_told_s != self._last_data_s
        ):
            self._stall_told_s = self._last_data_s
            self._pool.stalled(self.address)
        if silent_s < self._idle_timeout_s:
            self._timer = self._loop.call_later(self._next_check_s(silent_s), self._check_idle)
        elif self._paused:
            self._fail(StreamBroken(f"the reader took nothing for {silent_s:.1f} s"))
        else:
            self._fail(StreamIdle(f"engine silent for {silent_s:.1f} s mid-stream"))

    def _next_check_s(self, silent_s: float) -> float:
        """Seconds to the next deadline of this silence: the stall report (if not made
        yet), else the idle timeout."""
        to_idle_s = self._idle_timeout_s - silent_s
        stall_after_s = self._pool.stall_after_s
        if not stall_after_s or self._stall_told_s == self._last_data_s:
            return to_idle_s
        # The stream was not silent all along: the next stall is stall_after_s from the
        # last byte, which is at most stall_after_s from now.
        return min(to_idle_s, max(stall_after_s - silent_s, 0.0) or stall_after_s)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _give_back(self) -> None:
        self._cancel_timer()
        if self._keep_alive and not self.closed and not self._paused:
            self._reset()
            self._pool.keep(self)
        else:
            self.abort()


class EngineClient:
    """Calls engines over pooled keep-alive connections: streamed or read whole."""

    def __init__(self, *, pool_size: int, connect_timeout_s: float, keepalive_s: float) -> None:
        self.stall_after_s = 0.0  # 0: no stall reports (``watch_stalls``)
        self._on_stall: StallReport = lambda address: None
        self._pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], list[EngineConnection]] = {}
        self._open: set[EngineConnection] = set()  # each holds one of the pool's slots
        self._slots: asyncio.Semaphore | None = None

    @property
    def idle_connections(self) -> int:
        return sum(len(connections) for connections in self._idle.values())

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def post_json(self, url: str, body: bytes, *, timeout_s: float) -> bytes:
        """POST and read the whole answer within ``timeout_s``; raise on any non-200."""
        try:
            async with asyncio.timeout(timeout_s):
                connection, first = await self._send(url, body, first_byte_timeout_s=timeout_s)
                try:
                    pieces, size = [first], len(first)
                    while piece := await connection.read():
                        pieces.append(piece)
                        size += len(piece)
                        if size > _WHOLE_ANSWER_BYTES:
                            raise StreamBroken(f"answer over {_WHOLE_ANSWER_BYTES} bytes")
                except BaseException:
                    connection.abort()
                    raise
        except TimeoutError:
            raise EngineUnreachable(f"{url}: no whole answer within {timeout_s} s") from None
        except StreamBroken as error:
            raise EngineUnreachable(f"{url}: {error}") from None
        connection.finish()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def open_stream(
        self, url: str, body: bytes, *, first_byte_timeout_s: float, idle_timeout_s: float
    ) -> tuple[EngineConnection, bytes]:
        """POST a streamed request to ``url``; the connection and the answer's first bytes.

        Waiting for the first bytes before answering the client means a failure before
        the first token is still an HTTP error, not a broken 200.
        """
        connection, first = await self._send(url, body, first_byte_timeout_s=first_byte_timeout_s)
        connection.watch_idle(idle_timeout_s)
        return connection, first

    async def _send(
        self, url: str, body: bytes, *, first_byte_timeout_s: float
    ) -> tuple[EngineConnection, bytes]:
        address, request = _request(url, body, request_id_var.get())
        for attempt in range(2):
            connection = self._reusable(address) if attempt == 0 else None
            if connection is None:
                connection = await self._connect(address)
            try:
                first = await connection.send(request, first_byte_timeout_s=first_byte_timeout_s)
            except _Stale:
                continue
            return connection, first
        raise EngineNotReached(f"{url}: connection closed unanswered twice")

    def watch_stalls(self, after_s: float, on_stall: StallReport) -> None:
        """Tell ``on_stall`` of each stream whose engine has sent nothing for ``after_s``
        (0: never)."""
        self.stall_after_s, self._on_stall = after_s, on_stall

    def stalled(self, address: tuple[str, int]) -> None:
        self._on_stall(address)

    def keep(self, connection: EngineConnection) -> None:
        connection.reused = True
        connection.idle_since_s = asyncio.get_running_loop().time()
        self._idle.setdefault(connection.address, []).append(connection)

    def forget(self, connection: EngineConnection) -> None:
        """A connection closed: its slot is free again."""
        idle = self._idle.get(connection.address)
        if idle and connection in idle:
            idle.remove(connection)
        if connection in self._open:
            self._open.discard(connection)
            assert self._slots is not None
            self._slots.release()

    def close(self) -> None:
        for connection in list(self._open):
            connection.abort()

    def fail_calls_to(self, engine_url: str, reason: str) -> int:
        """Fail every call in flight to one engine, as if its connection broke (a worker
        the router found dead: its streams migrate or end with an error event rather
        than wait out the idle timeout); how many there were."""
        address = engine_address(engine_url)
        for idle in self._idle.pop(address, []):  # a hung engine's: reused, they would hang
            idle.abort()
        calls = [c for c in self._open if c.address == address and not c.closed]
        for connection in calls:
            connection._fail(StreamBroken(reason))
        return len(calls)

    def _reusable(self, address: tuple[str, int]) -> EngineConnection | None:
        idle = self._idle.get(address)
        now_s = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            if connection.closed or now_s - connection.idle_since_s > self._keepalive_s:
                connection.abort()
                continue
            return connection
        return None

    async def _connect(self, address: tuple[str, int]) -> EngineConnection:
        loop = asyncio.get_running_loop()
        slots = self._slots = self._slots or asyncio.Semaphore(self._pool_size)
        if slots.locked():
            self._close_oldest_idle()
        try:
            if slots.locked():
                await asyncio.wait_for(slots.acquire(), self._connect_timeout_s)
            else:
                await slots.acquire()
        except asyncio.TimeoutError:
            raise EngineNotReached(
                f"all {self._pool_size} upstream connections busy for {self._connect_timeout_s} s"
            ) from None
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: EngineConnection(self, address), *address),
                self._connect_timeout_s,
            )
        except (OSError, asyncio.TimeoutError) as error:
            slots.release()
            raise EngineNotReached(f"{address[0]}:{address[1]}: {error!r}") from error
        except BaseException:
            slots.release()
            raise
        if connection.closed:  # lost before we got it: connection_lost found no slot to free
            slots.release()
            raise EngineNotReached(f"{address[0]}:{address[1]}: closed on connect")
        self._open.add(connection)
        return connection

    def _close_oldest_idle(self) -> None:
        """Every slot is taken: an idle connection (to any engine) makes room."""
        candidates = [c for connections in self._idle.values() for c in connections]
        if candidates:
            min(candidates, key=lambda c: c.idle_since_s).abort()


def _request(url: str, body: bytes, request_id: str | None) -> tuple[tuple[str, int], bytes]:
    parts = urlsplit(url)
    address = _address(parts)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = (
        f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    )
    if request_id is not None:
        head += f"{REQUEST_ID_HEADER}: {request_id}\r\n"
    return address, head.encode("latin-1") + b"\r\n" + body


def engine_address(engine_url: str) -> tuple[str, int]:
    """The (host, port) the calls to an engine go to, as ``on_stall`` reports it."""
    return _address(urlsplit(engine_url))


def _address(parts: SplitResult) -> tuple[str, int]:
    if parts.scheme != "http" or parts.hostname is None:
        raise EngineNotReached(f"{parts.geturl()}: streamed calls speak plain http only")
    return parts.hostname, parts.port or 80
