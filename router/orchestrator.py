"""Prefill-then-decode orchestration, and the colocated path.

Disaggregated request:
1. prefill: the client's request with ``max_tokens=1`` and ``do_remote_decode``
   goes to a prefill engine, which answers with a KV handoff;
2. decode: the client's request plus the handoff goes to a decode engine, which
   pulls the KV over NIXL and generates.

Failure rules:
- a prefill that fails (unreachable, 5xx, bad handoff) is retried on another
  prefill worker, up to ``prefill_retries``; an engine 4xx is the client's
  fault and is passed on as is;
- a decode that fails before its first byte is retried on another decode worker
  with the same handoff; after the first byte the relay sends an SSE error;
- a worker that is unreachable is marked unhealthy at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response, StreamingResponse

from contracts.workers import WorkerRole
from kvtransfer.handoff import (
    PREFILL_REQUEST_PARAMS,
    ExpiredHandoff,
    InvalidHandoff,
    KVHandoff,
    parse_handoff,
)
from router.errors import APIError, NoCapacity, UpstreamFailed, UpstreamRejected
from router.metrics import RouterMetrics
from router.registry import WorkerRegistry, WorkerState
from router.relay import StreamStats, relay_sse
from router.routing import Decision
from router.settings import RouterSettings
from router.upstream import EngineHTTPError, EngineUnreachable, Upstream
from router.worker_selection import PromptBlocks, WorkerSelector

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True, slots=True)
class GenerationCall:
    """One validated client request, ready to route."""

    path: str  # "/v1/completions" or "/v1/chat/completions"
    body: dict[str, Any]
    model: str
    stream: bool
    arrived_s: float
    # The name the client asked for: the model, or an alias with a routing policy of its own.
    requested_model: str = ""

    @property
    def routing_key(self) -> str:
        return self.requested_model or self.model

    @property
    def chat(self) -> bool:
        return "chat" in self.path


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The client's request reshaped for a prefill-only engine call."""
    request = dict(body)
    for key in ("stream_options", "max_completion_tokens", "min_tokens", "n"):
        request.pop(key, None)
    request["stream"] = False
    request["max_tokens"] = 1
    request["kv_transfer_params"] = PREFILL_REQUEST_PARAMS
    return request


class Orchestrator:
    def __init__(
        self,
        *,
        settings: RouterSettings,
        registry: WorkerRegistry,
        upstream: Upstream,
        metrics: RouterMetrics,
        selector: WorkerSelector,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._upstream = upstream
        self._metrics = metrics
        self._selector = selector
        self._clock = clock

    async def serve(self, call: GenerationCall) -> Response:
        now = self._clock()
        prefill_pool = self._registry.eligible(call.model, WorkerRole.PREFILL, now)
        decode_pool = self._registry.eligible(call.model, WorkerRole.DECODE, now)
        if prefill_pool and decode_pool:
            blocks = await self._selector.prompt_blocks(
                call.body, chat=call.chat, workers=prefill_pool
            )
            decode = self._pick(call, WorkerRole.DECODE, decode_pool, blocks, ())
            if decode is not None and self._prefill_on_decode(decode):
                return await self._generate(
                    call, decode_pool, mode="decode_local", handoff=None, blocks=blocks,
                    first=decode,
                )  # fmt: skip
            return await self._disaggregated(call, prefill_pool, decode_pool, blocks, decode)
        colocated_pool = self._registry.eligible(call.model, WorkerRole.COLOCATED, now)
        if colocated_pool:
            blocks = await self._selector.prompt_blocks(
                call.body, chat=call.chat, workers=colocated_pool
            )
            return await self._generate(
                call, colocated_pool, mode="colocated", handoff=None, blocks=blocks
            )
        missing = "prefill" if decode_pool else "decode" if prefill_pool else "any"
        raise NoCapacity(
            f"no ready {missing} worker for model {call.model!r}; retry shortly",
            code="no_ready_worker",
            retry_after_s=self._settings.retry_after_s,
        )

    def _pick(
        self,
        call: GenerationCall,
        role: WorkerRole,
        pool: list[WorkerState],
        blocks: PromptBlocks,
        tried: set[str] | tuple[()],
    ) -> Decision | None:
        decision = self._selector.pick(call.routing_key, role, pool, blocks, tuple(tried))
        if decision is not None:
            policy = self._selector.policy_of(call.routing_key)
            self._metrics.routing_decisions.labels(
                call.routing_key, role.value, policy, decision.reason
            ).inc()
        return decision

    def _prefill_on_decode(self, decode: Decision) -> bool:
        """Conditional disaggregation: is the prompt's uncached part short enough to
        prefill on the decode worker, which has the room, rather than ship KV?"""
        settings = self._settings
        return (
            decode.uncached_tokens <= settings.conditional_disagg_max_uncached_tokens
            and decode.worker.load.kv_cache_usage_perc < settings.conditional_disagg_max_kv_usage
        )

    async def _disaggregated(
        self,
        call: GenerationCall,
        prefill_pool: list[WorkerState],
        decode_pool: list[WorkerState],
        blocks: PromptBlocks,
        decode: Decision | None,
    ) -> Response:
        handoff = await self._prefill_with_retries(call, prefill_pool, blocks)
        try:
            handoff.check_lease(self._clock(), self._settings.kv_lease_s)
        except ExpiredHandoff:
            # The event loop stalled past the lease; the blocks may be gone.
            handoff = await self._prefill_with_retries(call, prefill_pool, blocks)
        return await self._generate(
            call, decode_pool, mode="disaggregated", handoff=handoff, blocks=blocks, first=decode,
            reprefill=lambda: self._prefill_with_retries(call, prefill_pool, blocks),
        )  # fmt: skip

    async def _prefill_with_retries(
        self, call: GenerationCall, pool: list[WorkerState], blocks: PromptBlocks
    ) -> KVHandoff:
        body = json.dumps(prefill_body(call.body)).encode()
        tried: set[str] = set()
        failures: list[str] = []
        for attempt in range(1 + self._settings.prefill_retries):
            decision = self._pick(call, WorkerRole.PREFILL, pool, blocks, tried)
            if decision is None:
                break
            worker = decision.worker
            if attempt:
                self._metrics.prefill_retries.labels(call.model).inc()
            tried.add(worker.worker_id)
            self._selector.record(worker.worker_id, blocks, decision)
            started_s = self._clock()
            try:
                with self._selector.track(worker.worker_id, decision.uncached_tokens):
                    payload = await self._upstream.post_json(
                        worker.engine_url + call.path, body,
                        timeout_s=self._settings.prefill_timeout_s,
                    )  # fmt: skip
                handoff = parse_handoff(
                    json.loads(payload).get("kv_transfer_params"), issued_at_s=self._clock()
                )
            except EngineUnreachable as error:
                self._worker_failed(worker, "unreachable")
                failures.append(f"{worker.worker_id}: unreachable ({error})")
            except EngineHTTPError as error:
                if error.status < 500:
                    raise UpstreamRejected(error.status, error.body) from None
                self._metrics.upstream_failures.labels("prefill", f"http_{error.status}").inc()
                failures.append(f"{worker.worker_id}: HTTP {error.status}")
            except (InvalidHandoff, ValueError) as error:
                self._metrics.upstream_failures.labels("prefill", "bad_handoff").inc()
                failures.append(f"{worker.worker_id}: {error}")
            else:
                self._metrics.prefill_latency.labels(call.model).observe(self._clock() - started_s)
                return handoff
        raise UpstreamFailed("prefill failed: " + "; ".join(failures), code="prefill_failed")

    async def _generate(
        self,
        call: GenerationCall,
        pool: list[WorkerState],
        *,
        mode: str,
        handoff: KVHandoff | None,
        blocks: PromptBlocks,
        first: Decision | None = None,
        reprefill: Callable[[], Awaitable[KVHandoff]] | None = None,
    ) -> Response:
        request = dict(call.body)
        if handoff is not None:
            request["kv_transfer_params"] = handoff.to_decode_params()
        body = json.dumps(request).encode()
        role = pool[0].role
        tried: set[str] = set()
        last_error: APIError | None = None
        reprefills_left = self._settings.kv_lease_reprefills if reprefill else 0
        for _ in range(len(pool)):
            if (
                tried
                and reprefill is not None
                and reprefills_left
                and handoff is not None
                and not handoff.lease_holds(self._clock(), self._settings.kv_lease_s)
            ):
                # The next decode would pull blocks the producer may have reused.
                reprefills_left -= 1
                self._metrics.kv_lease_reprefills.labels(call.model).inc()
                handoff = await reprefill()
                request["kv_transfer_params"] = handoff.to_decode_params()
                body = json.dumps(request).encode()
            decision = first if first is not None and not tried else None
            decision = decision or self._pick(call, role, pool, blocks, tried)
            if decision is None:
                break
            worker = decision.worker
            tried.add(worker.worker_id)
            self._selector.record(worker.worker_id, blocks, decision)
            # A decode that pulls KV computes nothing; otherwise the worker prefills.
            tokens = 0 if handoff is not None else decision.uncached_tokens
            end = self._selector.begin(worker.worker_id, tokens)
            try:
                if call.stream:
                    return await self._stream(call, worker, body, mode, handoff, end)
                return await self._complete(call, worker, body, mode)
            except EngineUnreachable as error:
                self._worker_failed(worker, "unreachable")
                last_error = UpstreamFailed(
                    f"{worker.role.value} worker {worker.worker_id} failed before its "
                    f"first byte: {error}",
                    code="decode_failed",
                )
            except EngineHTTPError as error:
                if error.status < 500:
                    raise UpstreamRejected(error.status, error.body) from None
                self._metrics.upstream_failures.labels(
                    worker.role.value, f"http_{error.status}"
                ).inc()
                last_error = UpstreamFailed(
                    f"{worker.role.value} worker {worker.worker_id} answered {error.status}",
                    code="decode_failed",
                )
            finally:
                if not call.stream:
                    end()
        raise last_error or NoCapacity(
            "no worker left to try", retry_after_s=self._settings.retry_after_s
        )

    async def _complete(
        self, call: GenerationCall, worker: WorkerState, body: bytes, mode: str
    ) -> Response:
        payload = await self._upstream.post_json(
            worker.engine_url + call.path, body, timeout_s=self._settings.first_token_timeout_s
        )
        elapsed_s = self._clock() - call.arrived_s
        self._metrics.ttft.labels(call.model, mode).observe(elapsed_s)
        self._metrics.e2e.labels(call.model, mode).observe(elapsed_s)
        return Response(content=payload, media_type="application/json")

    async def _stream(
        self,
        call: GenerationCall,
        worker: WorkerState,
        body: bytes,
        mode: str,
        handoff: KVHandoff | None,
        end: Callable[[], None],
    ) -> StreamingResponse:
        first_byte_timeout_s = self._settings.first_token_timeout_s
        if handoff is not None and self._settings.kv_lease_guard:
            # A decode that has not produced its first token when the producer's lease
            # ends may pull blocks that were already reused (vLLM then logs "potentially
            # invalid KV blocks"): fail it rather than relay output from garbage KV.
            lease_left_s = self._settings.kv_lease_s - (self._clock() - handoff.issued_at_s)
            first_byte_timeout_s = max(0.0, min(first_byte_timeout_s, lease_left_s))
        try:
            response, first = await self._upstream.open_stream(
                worker.engine_url + call.path,
                body,
                first_byte_timeout_s=first_byte_timeout_s,
                idle_timeout_s=self._settings.stream_idle_timeout_s,
            )
        except BaseException:
            end()
            raise
        itl = self._metrics.itl.labels(call.model)

        def on_end(stats: StreamStats) -> None:
            end()
            now = self._clock()
            if stats.first_byte_s is not None:
                self._metrics.ttft.labels(call.model, mode).observe(
                    stats.first_byte_s - call.arrived_s
                )
            self._metrics.e2e.labels(call.model, mode).observe(now - call.arrived_s)
            self._metrics.output_chunks.labels(call.model).inc(stats.events)
            if stats.failure:
                self._metrics.stream_errors.labels(call.model).inc()
                self._worker_failed(worker, "stream_broken")

        stream = relay_sse(
            response,
            first,
            stats=StreamStats(started_s=call.arrived_s),
            on_gap=itl.observe,
            on_end=on_end,
            clock=self._clock,
        )
        return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)

    def _worker_failed(self, worker: WorkerState, kind: str) -> None:
        self._metrics.upstream_failures.labels(worker.role.value, kind).inc()
        self._registry.mark_unhealthy(worker.worker_id)
