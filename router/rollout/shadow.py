"""Shadow traffic: a mirrored copy of a request to the route's shadow version, compared
with what the client got, and never in the client's way.

- The copy runs in a task of its own, after the client's request was placed; the client's
  answer never waits for it, and its failure is recorded, never raised.
- It is shed first: past ``shadow_max_inflight`` copies in flight, or while the router's
  queue for the model or the shadow's own engines have requests waiting, the copy is not
  sent (counted as ``shed``). It skips admission, so it takes nothing from the tenant's
  rate limits or the prod queue.
- It is never streamed: the whole answer is compared with the client's, streamed or not
  (a mirrored stream's text is gathered as it is relayed). For a greedy request
  (``temperature: 0``), ``same_text`` says whether the texts are equal; for a sampled
  one, or a stream that did not end with ``[DONE]``, it is None.
- Records are kept per router, the newest ``shadow_records_kept``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response

from contracts.logs import request_id_var
from router.admission.tenants import PRIORITIES
from router.errors import APIError
from router.prepare.prepare import PreparedRequest
from router.rollout.safety import answer_text

log = logging.getLogger("pdserve.router")


@dataclass(slots=True)
class ShadowRecord:
    at_unix_s: float
    request_id: str
    model: str
    version: str
    outcome: str  # ok, error, timeout
    status: int | None = None
    latency_s: float | None = None
    prod_status: int | None = None
    prod_latency_s: float | None = None
    prod_streamed: bool | None = None
    completion_tokens: int | None = None
    prod_completion_tokens: int | None = None
    same_text: bool | None = None


@dataclass(slots=True)
class PrimaryOutcome:
    status: int
    latency_s: float
    body: bytes | None  # the whole answer, when it was not streamed
    text: str | None = None  # a stream's text, when it ended with [DONE]


class ShadowTicket:
    """The client's side, handed to the mirror once the client's answer is known."""

    def __init__(self) -> None:
        self._done: asyncio.Future[PrimaryOutcome | None] = (
            asyncio.get_running_loop().create_future()
        )

    def primary(self, outcome: PrimaryOutcome | None) -> None:
        if not self._done.done():
            self._done.set_result(outcome)

    async def wait(self, timeout_s: float) -> PrimaryOutcome | None:
        try:
            return await asyncio.wait_for(asyncio.shield(self._done), timeout_s)
        except TimeoutError:
            return None


ShadowServe = Callable[[PreparedRequest], Awaitable[Response]]


class ShadowMirror:
    def __init__(
        self,
        serve: ShadowServe,
        *,
        max_inflight: int,
        timeout_s: float,
        records_kept: int,
        count: Callable[[str, str], None],
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._serve = serve
        self._max_inflight = max_inflight
        self._timeout_s = timeout_s
        self._count = count  # (model, outcome)
        self._clock = clock
        self._wall_clock = wall_clock
        self._tasks: set[asyncio.Task[None]] = set()
        self.records: collections.deque[ShadowRecord] = collections.deque(maxlen=records_kept)

    def __repr__(self) -> str:
        return f"ShadowMirror(inflight={len(self._tasks)})"

    def mirror(self, request: PreparedRequest, version: str, *, busy: bool) -> ShadowTicket | None:
        """Send a copy to ``version`` unless it must be shed; the ticket takes the
        client's outcome."""
        if busy or len(self._tasks) >= self._max_inflight:
            self._count(request.model, "shed")
            return None
        body = {k: v for k, v in request.body.items() if k not in ("stream", "stream_options")}
        copy = dataclasses.replace(
            request, body=body, stream=False, stage="shadow", version=version,
            priority=len(PRIORITIES) - 1, arrived_s=self._clock(),
        )  # fmt: skip
        ticket = ShadowTicket()
        task = asyncio.create_task(self._run(copy, ticket, request_id_var.get()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return ticket

    async def _run(self, request: PreparedRequest, ticket: ShadowTicket, request_id: str) -> None:
        request_id_var.set(f"{request_id}-shadow")
        record = ShadowRecord(
            at_unix_s=self._wall_clock(), request_id=request_id, model=request.model,
            version=str(request.version), outcome="ok",
        )  # fmt: skip
        answer: dict[str, Any] | None = None
        try:
            response = await asyncio.wait_for(self._serve(request), self._timeout_s)
            record.status = response.status_code
            answer = json.loads(bytes(response.body))
        except TimeoutError:
            record.outcome = "timeout"
        except APIError as error:
            record.outcome, record.status = "error", error.status
        except Exception as error:  # the shadow's failure is recorded, never the client's
            log.warning("shadow request to %s failed: %r", request.version, error)
            record.outcome = "error"
        record.latency_s = round(self._clock() - request.arrived_s, 6)
        if record.outcome == "ok" and (record.status or 200) >= 400:
            record.outcome = "error"
        primary = await ticket.wait(self._timeout_s)
        if primary is not None:
            _compare(record, primary, answer, request.body)
        self.records.append(record)
        self._count(request.model, record.outcome)
        if record.same_text is False:
            self._count(request.model, "mismatch")


def _compare(
    record: ShadowRecord, primary: PrimaryOutcome, answer: dict[str, Any] | None, body: dict
) -> None:
    record.prod_status = primary.status
    record.prod_latency_s = round(primary.latency_s, 6)
    record.prod_streamed = primary.body is None
    prod = None
    if primary.body is not None:
        try:
            prod = json.loads(primary.body)
        except ValueError:
            prod = None
    if isinstance(answer, dict):
        record.completion_tokens = (answer.get("usage") or {}).get("completion_tokens")
    if isinstance(prod, dict):
        record.prod_completion_tokens = (prod.get("usage") or {}).get("completion_tokens")
    prod_text = answer_text(prod) if isinstance(prod, dict) else primary.text
    greedy = body.get("temperature") == 0
    if greedy and isinstance(answer, dict) and prod_text is not None and primary.status == 200:
        record.same_text = answer_text(answer) == prod_text


def summary(records: list[ShadowRecord]) -> dict[str, Any]:
    compared = [r for r in records if r.same_text is not None]
    done = [r for r in records if r.latency_s is not None and r.prod_latency_s is not None]
    return {
        "records": len(records),
        "errors": sum(r.outcome != "ok" for r in records),
        "greedy_compared": len(compared),
        "greedy_same_text": sum(bool(r.same_text) for r in compared),
        "mean_latency_s": _mean([r.latency_s for r in done]),
        "mean_prod_latency_s": _mean([r.prod_latency_s for r in done]),
    }


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 6) if present else None
