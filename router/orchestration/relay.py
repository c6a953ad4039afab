"""Relay an engine's SSE stream to the client, event-aligned.

``SSERelay`` cuts the engine's bytes into whole events and keeps the stream's account
(first byte, gaps, usage, ``[DONE]``). Two ways drive it: ``relay_sse``, an async
iterator for any ASGI server and for wrappers that read the events (fan-out, safety
screen), and ``sse_passthrough.py``, which writes events from the engine connection's
callback straight to the client's socket.

Invariants:
- Only whole SSE events (ending in a blank line) are forwarded, so a failure
  mid-stream can always be followed by a clean ``event: error``.
- A stream that ends without ``data: [DONE]`` is a failure, never a silent
  truncation.
- However the relay ends (done, failure, client gone), the engine connection is
  finished or closed; closing it makes vLLM abort the request and free its KV blocks.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from router.errors import APIError, UpstreamFailed, UpstreamTimeout, sse_error_event
from router.orchestration.engine_client import EngineConnection, StreamIdle
from router.orchestration.engine_errors import ABORTED, EngineAborted
from router.orchestration.sse_events import DATA, DONE, EVENT_END
from router.orchestration.usage import Usage, usage_in_events

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# A choice that ended as an answer ends (not aborted); the marks of a stream's end.
_FINISHED = re.compile(rb'"finish_reason":\s*"(?!abort")')
_END_MARKS = re.compile(rb'"choices":\s*\[\]|data: \[DONE\]')
_ERROR_DATA = re.compile(rb'data: \{"(?:error"|object":\s*"error")')


@dataclass(slots=True)
class StreamStats:
    started_s: float
    first_byte_s: float | None = None
    events: int = 0
    completed: bool = False
    failure: str | None = None
    usage: Usage | None = None  # the engine's, from its usage chunk


class SSERelay:
    """Whole events out of an engine's bytes, and the stream's account of them."""

    __slots__ = ("_clock", "_edit", "_finished", "_last_s", "_on_gap", "_pending",
                 "_strip_usage", "aborted", "stats")  # fmt: skip

    def __init__(
        self,
        stats: StreamStats,
        *,
        on_gap: Callable[[float], None],
        clock: Callable[[], float] = time.monotonic,
        strip_usage: bool = False,
        edit: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """``strip_usage``: the usage chunk was asked for by the router, not the client.
        ``edit``: what the client gets of each run of whole events (a migration's
        ``Transcript``); it may raise to fail the stream."""
        self.stats = stats
        self._on_gap = on_gap
        self._clock = clock
        self._strip_usage = strip_usage
        self._edit = edit
        self._pending = b""
        self._last_s = clock()
        self.aborted = False  # the engine aborted the request: the stream must not complete
        self._finished = False  # a choice has ended (stop, length...): [DONE] may follow

    def switched_engine(self) -> None:
        """The stream goes on from another engine: the failed one's partial event is dropped."""
        self._pending = b""
        self.aborted = self._finished = False

    def feed(self, chunk: bytes) -> bytes:
        """The whole events ``chunk`` completes (``b""`` if none), ready to forward."""
        if self.aborted:  # what follows an abort (usage, [DONE]) is not the answer's end
            return b""
        pending = self._pending + chunk if self._pending else chunk
        cut = pending.rfind(EVENT_END)
        if cut < 0:
            self._pending = pending
            return b""
        if cut + 2 == len(pending):
            ready, self._pending = pending, b""
        else:
            ready, self._pending = pending[: cut + 2], pending[cut + 2 :]
        self._finished = self._finished or _FINISHED.search(ready) is not None
        if (end := _cut_short(ready, self._finished)) is not None:
            # Relayed, its [DONE] would make a cut answer look whole: keep the events
            # before it, and the driver fails the stream (or moves it elsewhere).
            self.aborted, self._pending, ready = True, b"", ready[:end]
            if not ready:
                return b""
        if self._edit is not None:
            ready = self._edit(ready)
            if not ready:
                return b""
        stats, now = self.stats, self._clock()
        if stats.first_byte_s is None:
            stats.first_byte_s = now
        else:
            self._on_gap(now - self._last_s)
        self._last_s = now
        usage, ready = usage_in_events(ready, strip=self._strip_usage)
        if usage is not None:
            stats.usage = usage
        stats.events += ready.count(DATA)
        if DONE in ready:
            stats.completed = True
        return ready

    def failed(self, error: BaseException | None) -> bytes:
        """The stream ended before ``[DONE]``: record why; the event that tells the client."""
        answer: APIError
        if error is None:
            self.stats.failure = "decode engine closed the stream before [DONE]"
            answer = UpstreamFailed(self.stats.failure, code="stream_truncated")
        elif isinstance(error, APIError):  # the router's own verdict, e.g. a migration's
            self.stats.failure = error.message
            answer = error
        elif isinstance(error, EngineAborted):
            self.stats.failure = "decode engine aborted the request mid-stream (shutting down)"
            answer = UpstreamFailed(self.stats.failure, code="engine_aborted")
        elif isinstance(error, StreamIdle):
            self.stats.failure = "decode engine went silent mid-stream"
            answer = UpstreamTimeout(self.stats.failure, code="stream_idle_timeout")
        else:
            self.stats.failure = f"decode engine failed mid-stream: {type(error).__name__}"
            answer = UpstreamFailed(self.stats.failure, code="stream_broken")
        return sse_error_event(answer)


# Called when a stream's engine fails mid-answer (None: it closed before [DONE]): the
# connection and first bytes of another engine that goes on with it, or None.
Resume = Callable[[BaseException | None], Awaitable["tuple[EngineConnection, bytes] | None"]]


async def no_resume(error: BaseException | None) -> None:
    return None


def _cut_short(events: bytes, finished: bool) -> int | None:
    """Where a run of events stops being the answer, or None while it is whole: at an
    event ending a choice with "abort", at an error vLLM sends in band (``data:
    {"error": ...}``, then ``[DONE]``, when its engine dies under a stream), or at the
    usage chunk or ``[DONE]`` of a stream none of whose choices ended (vLLM shutting
    down was seen to end a stream so in CI: cut text, usage and [DONE])."""
    marks = [m.start() for m in (ABORTED.search(events), _ERROR_DATA.search(events)) if m]
    if not finished and (end := _END_MARKS.search(events)) is not None:
        marks.append(end.start())
    if not marks:
        return None
    cut = events.rfind(EVENT_END, 0, min(marks))
    return cut + 2 if cut >= 0 else 0


async def relay_sse(
    connection: EngineConnection,
    first_chunk: bytes,
    relay: SSERelay,
    *,
    on_end: Callable[[StreamStats], None],
    resume: Resume = no_resume,
) -> AsyncIterator[bytes]:
    """The relay's events as an async iterator, read from the connection."""
    chunk = first_chunk
    try:
        while True:
            error: BaseException | None = None
            try:
                while chunk:
                    ready = relay.feed(chunk)
                    if ready:
                        yield ready
                        if relay.stats.completed:
                            return
                    if relay.aborted:
                        raise EngineAborted
                    chunk = await connection.read()
            except Exception as failure:  # StreamIdle, StreamBroken, a diverged continuation
                error = failure
            connection.abort()
            resumed = await resume(error)
            if resumed is None:
                yield relay.failed(error)
                return
            relay.switched_engine()
            connection, chunk = resumed
    finally:
        if relay.stats.completed:
            connection.finish()
        else:
            connection.abort()
        on_end(relay.stats)
