"""The orchestrate stage: the prefill phase, the decode phase, and what a failure means.

Disaggregated request:
1. prefill: the client's request with ``max_tokens=1`` and ``do_remote_decode``
   goes to a prefill engine, which answers with a KV handoff;
2. decode: the client's request plus the handoff goes to a decode engine, which
   pulls the KV over NIXL and generates.
A colocated pool, or the P/D decider sending a short prompt to the decode worker,
runs the decode phase alone.

Failure rules (``worker_outcomes.py`` counts every attempt of either phase: an engine
4xx is the client's, passed on as is; an unreachable worker is ejected at once):
- a failed prefill (unreachable, 5xx, bad handoff) is retried on another prefill
  worker, up to ``prefill_retries``;
- a decode that fails before its first byte is retried on another decode worker: with
  the same handoff only if the request never reached the failed one (no connection:
  ``EngineNotReached``). Otherwise the failed one may have pulled the KV, which the
  producer then frees for reuse: the handoff is released (``kv_release.py``) and never
  sent again; the next decode gets a fresh prefill's if the failed one was sent the
  request and went silent (a hang, a missed lease), else computes the prompt itself.
  After the first byte a stream migrates (``migration.py``) or the relay sends an SSE
  error;
- a handoff is never forwarded past its lease: before each decode attempt an expired
  one is re-prefilled (``_renewed``, at most ``kv_lease_reprefills`` times, counted),
  since the producer may have reused its blocks.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response

from contracts.workers import WorkerRole
from kvtransfer.handoff import PREFILL_REQUEST_PARAMS, InvalidHandoff, KVHandoff, parse_handoff
from router.admission.ttft_predictor import PrefillMark, TTFTPredictor
from router.errors import APIError, NoCapacity, Overloaded, UpstreamFailed
from router.fleet.registry import Pools, WorkerRegistry, WorkerState
from router.fleet.worker_networks import WorkerNetworks
from router.observability.metrics import RouterMetrics
from router.orchestration.engine_body import engine_json
from router.orchestration.engine_client import EngineClient, EngineConnection
from router.orchestration.engine_errors import (
    ABORTED,
    EngineAborted,
    EngineHTTPError,
    EngineNotReached,
    EngineUnreachable,
)
from router.orchestration.kv_release import KVReleases
from router.orchestration.migration import Continuation, Transcript, resume_mode
from router.orchestration.relay import SSE_HEADERS, Resume, SSERelay, StreamStats, no_resume
from router.orchestration.sse_passthrough import EngineSSEResponse
from router.orchestration.take_back import BatchPrefillHolds, TakenBack, unless_taken_back
from router.orchestration.usage import usage_in_answer, with_usage_requested
from router.orchestration.worker_outcomes import WorkerOutcomes
from router.prepare.prepare import PreparedRequest
from router.prepare.prompt_blocks import PromptBlocks
from router.scheduling.load import InFlight, InFlightLoad, Ticket
from router.scheduling.schedule import Scheduler
from router.scheduling.scheduling_plugins import Decision
from router.settings import RouterSettings

log = logging.getLogger("pdserve.router")
PREDICTED_TTFT_HEADER = "x-pdserve-predicted-ttft-ms"

_ATTEMPT_FAILURES = (EngineUnreachable, EngineHTTPError, InvalidHandoff, EngineAborted)
_MAX_MODELS_NOTED = 1024  # models whose degraded state is remembered for its log lines


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
        engines: EngineClient,
        metrics: RouterMetrics,
        scheduler: Scheduler,
        load: InFlightLoad,
        predictor: TTFTPredictor,
        networks: WorkerNetworks | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._networks = networks or WorkerNetworks(settings.server.allowed_worker_networks)
        self._timeouts = settings.upstream
        self._leases = settings.leases
        self._retry_after_s = settings.server.retry_after_s
        self._serve_degraded = settings.health.serve_degraded
        self._registry = registry
        self._engines = engines
        self._metrics = metrics
        self._scheduler = scheduler
        self._load = load
        self._predictor = predictor
        self._clock = clock
        self._outcomes = WorkerOutcomes(registry, metrics, clock)
        self._take_back = settings.admission.batch_prefill_take_back
        self._batch_prefills = BatchPrefillHolds()
        self._degraded: dict[str, WorkerRole | None] = {}  # by model: the pool left alone
        released = metrics.kv_releases.labels
        self._releases = KVReleases(
            engines, timeout_s=self._timeouts.first_token_timeout_s,
            on_outcome=lambda outcome: released(outcome).inc(),
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"Orchestrator(scheduler={self._scheduler!r})"

    async def serve(
        self,
        request: PreparedRequest,
        pools: Pools,
        blocks: PromptBlocks,
        prefilled: Callable[[], None] = lambda: None,
    ) -> Response:
        """``prefilled`` is called once the prompt is computed (admission's queue frees)."""
        if pools.disaggregated:
            decode = self._pick(request, WorkerRole.DECODE, pools.decode, blocks)
            if decode is not None and self._scheduler.prefill_on_decode(decode):
                return await self._decode_phase(
                    request, pools, pools.decode, blocks, mode="decode_local", first=decode,
                    prefilled=prefilled,
                )  # fmt: skip
            # The decode's KV is reserved now, not after the prefill: others picking a
            # decode worker meanwhile must see this request's share taken.
            reservation = self._reserve_kv(request, decode)
            try:
                try:
                    handoff = await self._prefill_phase(request, pools.prefill, blocks)
                except UpstreamFailed as failure:  # every prefill tried failed
                    reservation.end()
                    return await self._served_by_one_pool(
                        request, pools, blocks, WorkerRole.DECODE, failure, prefilled
                    )
                prefilled()
                try:
                    return await self._decode_phase(
                        request, pools, pools.decode, blocks, mode="disaggregated",
                        first=decode, handoff=handoff,
                    )  # fmt: skip
                except UpstreamFailed as failure:  # every decode tried failed before its first byte
                    reservation.end()
                    return await self._served_by_one_pool(
                        request, pools, blocks, WorkerRole.PREFILL, failure, prefilled
                    )
            finally:
                reservation.end()  # the answer's own ticket holds it from its start
        if pools.colocated:
            self._note_degraded(request.model, pools.degraded)
            mode = "colocated" if pools.degraded is None else f"{pools.degraded.value}_only"
            return await self._decode_phase(
                request, pools, pools.colocated, blocks, mode=mode, prefilled=prefilled
            )
        missing = "prefill" if pools.decode else "decode" if pools.prefill else "any"
        raise NoCapacity(
            f"no ready {missing} worker for model {request.model!r}; retry shortly",
            code="no_ready_worker",
            retry_after_s=self._retry_after_s,
        )

    async def _served_by_one_pool(
        self,
        request: PreparedRequest,
        pools: Pools,
        blocks: PromptBlocks,
        left: WorkerRole,
        failure: UpstreamFailed,
        prefilled: Callable[[], None],
    ) -> Response:
        """The other pool's phase failed on every worker tried: ``left``'s workers answer
        the request whole (computing the prompt themselves), as when that pool is empty;
        unless ``serve_degraded`` is off, then the failure stands. A prefill worker that
        made the handoff still caches the prompt's blocks, so it computes little."""
        pool = pools.decode if left is WorkerRole.DECODE else pools.prefill
        if not (self._serve_degraded and pool):
            raise failure
        log.warning("%s: %s; its %s workers answer it whole", request.model, failure.message,
                    left.value)  # fmt: skip
        self._metrics.degraded_requests.labels(request.model, left.value).inc()
        try:
            return await self._decode_phase(
                request, pools, pool, blocks, mode=f"{left.value}_only", prefilled=prefilled
            )
        except UpstreamFailed as also:  # the first failure is the cause the client is told
            raise UpstreamFailed(
                f"{failure.message}; then the {left.value} pool alone: {also.message}",
                code=failure.code,
            ) from None

    def _note_degraded(self, model: str, left: WorkerRole | None) -> None:
        """Count a request served by one P/D pool alone; log when a model starts or stops
        being served so."""
        if left is not None:
            self._metrics.degraded_requests.labels(model, left.value).inc()
        if self._degraded.get(model) == left:
            return
        if left is not None:
            lost = "decode" if left is WorkerRole.PREFILL else "prefill"
            log.warning("%s has no ready %s worker: its %s workers serve whole requests",
                        model, lost, left.value)  # fmt: skip
        elif model in self._degraded:
            log.info("%s is served disaggregated again", model)
        if len(self._degraded) < _MAX_MODELS_NOTED or model in self._degraded:
            self._degraded[model] = left

    def _reserve_kv(self, request: PreparedRequest, decode: Decision | None) -> Ticket:
        if decode is None:
            return Ticket(InFlight(), 0)  # a detached record: nothing to hold
        kv_tokens = decode.uncached_tokens + request.max_output_tokens
        return self._load.begin(decode.worker.worker_id, 0, kv_tokens=kv_tokens)

    def _prefill_sent(self, worker_id: str) -> PrefillMark:
        """A prompt is sent to be computed there now, beside what that worker runs."""
        there = self._load.of(worker_id)
        return self._predictor.prefill_sent(
            worker_id, self._clock(), there.tokens, running=there.requests
        )

    def _pick(
        self,
        request: PreparedRequest,
        role: WorkerRole,
        pool: Sequence[WorkerState],
        blocks: PromptBlocks,
        tried: Collection[str] = (),
    ) -> Decision | None:
        key = request.routing_key
        first_hop = role is not WorkerRole.DECODE
        decision = self._scheduler.pick(
            key, role, pool, blocks, tried,
            kv_output_tokens=None if role is WorkerRole.PREFILL else request.max_output_tokens,
            prefill_deadline_s=request.prefill_deadline_s if first_hop else None,
            yields=request.yields and first_hop,
        )  # fmt: skip
        if decision is not None:
            policy = self._scheduler.policy_of(key)
            self._metrics.routing_decisions.labels(key, role.value, policy, decision.reason).inc()
        return decision

    async def _prefill_phase(
        self, request: PreparedRequest, pool: Sequence[WorkerState], blocks: PromptBlocks
    ) -> KVHandoff:
        prefill = prefill_body(request.body)
        tried: list[str] = []
        failures: list[str] = []
        for attempt in range(1 + self._timeouts.prefill_retries):
            decision = self._pick(request, WorkerRole.PREFILL, pool, blocks, tried)
            if decision is None:
                break
            worker = decision.worker
            if attempt:
                self._metrics.prefill_retries.labels(request.model).inc()
            tried.append(worker.worker_id)
            self._scheduler.place(blocks, decision)
            self._take_back_batch_prefills(request, worker, decision.uncached_tokens)
            started_s = self._clock()
            mark = self._prefill_sent(worker.worker_id)
            try:
                with self._load.begin(worker.worker_id, decision.uncached_tokens,
                                      deadline_s=request.prefill_deadline_s,
                                      yields=request.yields):  # fmt: skip
                    payload = await self._prefill_call(request, worker, prefill)
                handoff = _handoff_in(payload, issued_at_s=self._clock(), networks=self._networks)
            except _ATTEMPT_FAILURES as error:
                failures.append(self._outcomes.triage(worker, error))
                continue
            self._outcomes.answered(worker)
            seconds = handoff.issued_at_s - started_s
            self._metrics.stage.labels(request.model, "prefill").observe(seconds)
            self._predictor.observe_prefill(
                mark, decision.uncached_tokens, handoff.issued_at_s,
                queued_after=self._load.of(worker.worker_id).tokens,
            )  # fmt: skip
            return handoff
        raise UpstreamFailed("prefill failed: " + "; ".join(failures), code="prefill_failed")

    async def _prefill_call(
        self, request: PreparedRequest, worker: WorkerState, prefill: dict[str, Any]
    ) -> Any:
        call = self._engines.post_json(
            worker.engine_url + request.path, engine_json(prefill, request, worker),
            timeout_s=self._timeouts.prefill_timeout_s,
        )  # fmt: skip
        if not (request.yields and self._take_back):
            return await call
        with self._batch_prefills.hold(worker.worker_id) as taken:
            try:
                return await unless_taken_back(call, taken)
            except TakenBack:
                raise Overloaded(
                    "an interactive prompt took this batch line's prefill worker; the line "
                    "runs later", code="batch_yields", retry_after_s=1,
                ) from None  # fmt: skip

    def _take_back_batch_prefills(
        self, request: PreparedRequest, worker: WorkerState, uncached_tokens: int
    ) -> None:
        """A prompt that does not yield, to be computed there: the batch prefills under
        way at that worker give it their part of the engine's steps (``take_back.py``)."""
        if not self._take_back or request.yields or not uncached_tokens:
            return
        taken = self._batch_prefills.take_back(worker.worker_id)
        if taken:
            self._metrics.batch_prefills_taken_back.labels(request.model).inc(taken)

    async def _decode_phase(
        self,
        request: PreparedRequest,
        pools: Pools,
        pool: Sequence[WorkerState],
        blocks: PromptBlocks,
        *,
        mode: str,
        first: Decision | None = None,
        handoff: KVHandoff | None = None,
        prefilled: Callable[[], None] = lambda: None,
    ) -> Response:
        role = pool[0].role
        tried: list[str] = []
        failures: list[str] = []
        reprefills_left, lease_s = self._leases.kv_lease_reprefills, self._leases.kv_lease_s
        renew = False  # the handoff went to a decode that may have pulled it: never again
        for _ in range(len(pool)):
            if handoff is not None and (renew or not handoff.lease_holds(self._clock(), lease_s)):
                handoff = await self._renewed(request, pools.prefill, blocks, reprefills_left)
                reprefills_left, renew = reprefills_left - 1, False
            decision = first if first is not None and not tried else None
            decision = decision or self._pick(request, role, pool, blocks, tried)
            if decision is None:
                break
            tried.append(decision.worker.worker_id)
            self._scheduler.place(blocks, decision)
            try:
                return await self._answer(request, pools, blocks, decision, handoff, mode,
                                          prefilled)  # fmt: skip
            except _ATTEMPT_FAILURES as error:
                failures.append(self._outcomes.triage(decision.worker, error))
                if handoff is None or isinstance(error, EngineNotReached):
                    continue  # it never got there: the next decode pulls the same KV
                self._release(request, handoff, pool, tried, decision.worker)
                # Sent and unanswered (a hang, a missed lease): a fresh prefill for the next
                # decode. Answered (5xx, an abort): the next computes the prompt itself.
                renew = isinstance(error, EngineUnreachable)
                handoff = handoff if renew else None
        if failures:
            raise UpstreamFailed(
                f"{role.value} failed before its first byte: " + "; ".join(failures),
                code="decode_failed",
            )
        raise NoCapacity("no worker left to try", retry_after_s=self._retry_after_s)

    def _release(
        self, request: PreparedRequest, handoff: KVHandoff, pool: Sequence[WorkerState],
        tried: Collection[str], failed: WorkerState,
    ) -> None:  # fmt: skip
        """A decode got ``handoff`` and failed before its first byte. It may have pulled the
        KV (the producer then frees the blocks for reuse), or failed before pulling (a
        dead engine core, a failed KV load under kv_load_failure_policy "fail", a hang, a
        shutdown), leaving the producer holding them until the lease: free them now
        through another decode (``kv_release.py``), or the failed one if it is alone."""
        consumer = next((w for w in pool if w.worker_id not in tried), failed)
        self._releases.release(request.model, handoff, consumer.engine_url)

    async def _renewed(
        self,
        request: PreparedRequest,
        prefill_pool: Sequence[WorkerState],
        blocks: PromptBlocks,
        reprefills_left: int,
    ) -> KVHandoff:
        """The one re-prefill path: a handoff past its lease may point at reused blocks."""
        if reprefills_left <= 0:
            raise UpstreamFailed(
                "the KV handoff outlived its lease and no re-prefill is left "
                f"(kv_lease_reprefills={self._leases.kv_lease_reprefills})",
                code="decode_failed",
            )
        self._metrics.kv_lease_reprefills.labels(request.model).inc()
        return await self._prefill_phase(request, prefill_pool, blocks)

    async def _answer(
        self,
        request: PreparedRequest,
        pools: Pools,
        blocks: PromptBlocks,
        decision: Decision,
        handoff: KVHandoff | None,
        mode: str,
        prefilled: Callable[[], None],
    ) -> Response:
        worker = decision.worker
        transcript = self._transcript(request)
        payload, client_wants_usage = _engine_payload(request, worker, handoff, transcript)
        # A decode that pulls KV computes nothing; otherwise the worker prefills.
        own = 0 if handoff is not None else decision.uncached_tokens
        mark = None if handoff is not None else self._prefill_sent(worker.worker_id)
        requests_there = self._load.of(worker.worker_id).requests + 1
        # Its KV there: the prompt blocks the worker does not hold yet, and the output.
        kv_tokens = decision.uncached_tokens + request.max_output_tokens
        ticket = self._load.begin(
            worker.worker_id, own, kv_tokens=kv_tokens,
            deadline_s=request.prefill_deadline_s if own else None, yields=request.yields,
        )  # fmt: skip

        def first_byte(at_s: float) -> None:
            self._outcomes.answered(worker)
            ticket.prefilled()
            prefilled()
            if mark is not None:
                self._predictor.observe_prefill(
                    mark, own, at_s, queued_after=self._load.of(worker.worker_id).tokens
                )
            else:
                handoff_s = at_s - handoff.issued_at_s
                self._predictor.observe_handoff(
                    worker.worker_id, requests_there, decision.uncached_tokens, handoff_s
                )
                self._metrics.stage.labels(request.model, "kv_handoff").observe(handoff_s)
            if request.predicted_ttft_s is not None:
                error_s = abs(at_s - request.arrived_s - request.predicted_ttft_s)
                self._metrics.ttft_prediction_error.labels(request.model).observe(error_s)

        if not request.stream:
            with ticket:
                return await self._complete(request, worker, payload, mode)
        seat = _Seat(worker, ticket)
        resume = no_resume
        if transcript is not None:
            resume = functools.partial(self._migrate, request, pools, blocks, transcript, seat)
        try:
            return await self._stream(
                request, seat, payload, mode, handoff, first_byte,
                strip_usage=not client_wants_usage, transcript=transcript, resume=resume,
            )  # fmt: skip
        except BaseException:
            ticket.end()
            raise

    async def _complete(
        self, request: PreparedRequest, worker: WorkerState, body: bytes, mode: str
    ) -> Response:
        called_s = self._clock()
        payload = await self._engines.post_json(
            worker.engine_url + request.path, body,
            timeout_s=self._timeouts.first_token_timeout_s,
        )  # fmt: skip
        if ABORTED.search(payload):  # a whole answer cut short: try another worker
            raise EngineAborted
        self._outcomes.answered(worker)
        self._metrics.stage.labels(request.model, "decode").observe(self._clock() - called_s)
        elapsed_s = self._clock() - request.arrived_s
        metrics, tenant_class = self._metrics, request.tenant_class
        metrics.observe_ttft(request.model, mode, tenant_class, elapsed_s, request.stage)
        metrics.e2e.labels(request.model, mode, tenant_class, request.stage).observe(elapsed_s)
        metrics.stages.answered(request.model, request.stage, error=False)
        usage = usage_in_answer(payload)
        if usage is not None:
            metrics.observe_usage(
                request.model, tenant_class, usage, counts_prompt=request.counts_prompt
            )
        return Response(
            content=payload, media_type="application/json", headers=_admission_headers(request)
        )

    async def _stream(
        self,
        request: PreparedRequest,
        seat: _Seat,
        body: bytes,
        mode: str,
        handoff: KVHandoff | None,
        first_byte: Callable[[float], None],
        *,
        strip_usage: bool,
        transcript: Transcript | None,
        resume: Resume,
    ) -> EngineSSEResponse:
        first_byte_timeout_s = self._timeouts.first_token_timeout_s
        if handoff is not None and self._leases.kv_lease_guard:
            # A decode that has not produced its first token when the producer's lease
            # ends may pull blocks that were already reused (vLLM then logs "potentially
            # invalid KV blocks"): fail it rather than relay output from garbage KV.
            lease_left_s = self._leases.kv_lease_s - (self._clock() - handoff.issued_at_s)
            first_byte_timeout_s = max(0.0, min(first_byte_timeout_s, lease_left_s))
        connection, first = await self._engines.open_stream(
            seat.worker.engine_url + request.path,
            body,
            first_byte_timeout_s=first_byte_timeout_s,
            idle_timeout_s=self._timeouts.stream_idle_timeout_s,
        )
        first_byte(self._clock())
        model, metrics = request.model, self._metrics

        def on_end(stats: StreamStats) -> None:
            seat.ticket.end()
            self._streamed(request, mode, stats)
            if stats.failure and not seat.failed:
                self._outcomes.failed(seat.worker, "stream_broken", at_once=True)

        relay = SSERelay(
            StreamStats(started_s=request.arrived_s), clock=self._clock,
            on_gap=metrics.itl_observer(model, request.stage), strip_usage=strip_usage,
            edit=None if transcript is None else transcript.edit,
        )  # fmt: skip
        headers = {**SSE_HEADERS, **_admission_headers(request)}
        return EngineSSEResponse(
            connection, first, relay, on_end=on_end, headers=headers, resume=resume
        )

    def _transcript(self, request: PreparedRequest) -> Transcript | None:
        """A record to continue the stream from, when it can be continued exactly."""
        if not request.stream or not self._timeouts.stream_migration_attempts:
            return None
        mode = resume_mode(request, inexact=self._timeouts.stream_migration_inexact)
        if mode is None:
            return None
        wants_ids = request.body.get("return_token_ids") is True
        max_bytes = self._timeouts.stream_migration_record_bytes
        return Transcript(request, mode, client_wants_ids=wants_ids, max_bytes=max_bytes)

    async def _migrate(
        self,
        request: PreparedRequest,
        pools: Pools,
        blocks: PromptBlocks,
        transcript: Transcript,
        seat: _Seat,
        error: BaseException | None,
    ) -> tuple[EngineConnection, bytes] | None:
        """The stream's engine failed mid-answer: another worker's stream that goes on
        with it (see ``migration.py``), or None and the client gets the error event."""
        seat.ticket.end()
        if isinstance(error, APIError):  # the router's verdict on a continuation, not a worker's
            # A diverged continuation is no failure of the worker that computed it: its
            # circuit must not open (seen on real vLLM: with the decode pool down, that
            # left the model no worker for circuit_open_s).
            seat.failed = True
            return None
        self._outcomes.failed(seat.worker, "stream_broken", at_once=True)
        seat.failed = True
        continuation = transcript.continuation()
        outcome, opened = "not_continuable", None
        if continuation is not None:
            opened = await self._continue_elsewhere(request, pools, blocks, continuation, seat)
            outcome = "no_worker" if opened is None else "migrated"
        self._metrics.stream_migrations.labels(request.model, outcome).inc()
        return opened

    async def _continue_elsewhere(
        self,
        request: PreparedRequest,
        pools: Pools,
        blocks: PromptBlocks,
        continuation: Continuation,
        seat: _Seat,
    ) -> tuple[EngineConnection, bytes] | None:
        output_tokens = continuation.output_tokens
        tried = [seat.worker.worker_id]
        # Another decode worker computes the longer prompt itself; then any other worker.
        candidates = ((WorkerRole.DECODE, pools.decode), (WorkerRole.COLOCATED, pools.colocated),
                      (WorkerRole.PREFILL, pools.prefill))  # fmt: skip
        for role, pool in candidates:
            while len(tried) <= self._timeouts.stream_migration_attempts:
                decision = self._pick(request, role, pool, blocks, tried)
                if decision is None:
                    break
                worker = decision.worker
                tried.append(worker.worker_id)
                own = decision.uncached_tokens
                ticket = self._load.begin(worker.worker_id, own, kv_tokens=own + output_tokens)
                try:
                    opened = await self._engines.open_stream(
                        worker.engine_url + continuation.path,
                        engine_json(continuation.body, request, worker),
                        first_byte_timeout_s=self._timeouts.first_token_timeout_s,
                        idle_timeout_s=self._timeouts.stream_idle_timeout_s,
                    )  # fmt: skip
                except _ATTEMPT_FAILURES as failure:
                    ticket.end()
                    if isinstance(failure, EngineHTTPError) and failure.status < 500:
                        log.warning("%s refused a continuation: %s", worker.worker_id, failure)
                        return None
                    self._outcomes.triage(worker, failure)
                    continue
                self._outcomes.answered(worker)
                log.info("a %s stream moved from %s to %s after %d tokens", request.model,
                         seat.worker.worker_id, worker.worker_id,
                         continuation.tokens_before)  # fmt: skip
                seat.worker, seat.ticket, seat.failed = worker, ticket, False
                return opened
        return None

    def _streamed(self, request: PreparedRequest, mode: str, stats: StreamStats) -> None:
        """A stream ended: its latencies, and its tokens when the engine reported usage."""
        metrics, model, tenant_class = self._metrics, request.model, request.tenant_class
        ended_s = self._clock()
        stage = request.stage
        metrics.e2e.labels(model, mode, tenant_class, stage).observe(ended_s - request.arrived_s)
        metrics.output_chunks.labels(model).inc(stats.events)
        metrics.stages.answered(model, stage, error=stats.failure is not None)
        if stats.failure:
            metrics.stream_errors.labels(model).inc()
        if stats.first_byte_s is None:
            return
        ttft_s = stats.first_byte_s - request.arrived_s
        metrics.observe_ttft(model, mode, tenant_class, ttft_s, stage)
        metrics.stage.labels(model, "decode").observe(ended_s - stats.first_byte_s)
        if stats.usage is None:
            return
        metrics.observe_usage(model, tenant_class, stats.usage, counts_prompt=request.counts_prompt)
        if stats.usage.completion_tokens > 1:
            tpot_s = (ended_s - stats.first_byte_s) / (stats.usage.completion_tokens - 1)
            metrics.tpot.labels(model).observe(tpot_s)


@dataclass
class _Seat:
    """Where a stream is served now: a migration moves it (and its load) elsewhere."""

    worker: WorkerState
    ticket: Ticket
    failed: bool = False  # the stream's failure is accounted for: counted, or not the worker's


def _engine_payload(
    request: PreparedRequest, worker: WorkerState, handoff: KVHandoff | None,
    transcript: Transcript | None,
) -> tuple[bytes, bool]:  # fmt: skip
    """What the answering engine gets, and whether the client asked for usage."""
    body, client_wants_usage = request.body, True
    if request.stream:  # the token counters need usage; the client gets it only if asked
        body, client_wants_usage = with_usage_requested(body)
    if transcript is not None:
        body = Transcript.engine_body(body)
    if handoff is not None:
        body = {**body, "kv_transfer_params": handoff.to_decode_params()}
    return engine_json(body, request, worker), client_wants_usage


def _handoff_in(payload: bytes, *, issued_at_s: float, networks: WorkerNetworks) -> KVHandoff:
    try:
        answer = json.loads(payload)
    except ValueError:
        raise InvalidHandoff("the prefill answer is not JSON") from None
    if not isinstance(answer, dict):
        raise InvalidHandoff("the prefill answer is not a JSON object")
    handoff = parse_handoff(answer.get("kv_transfer_params"), issued_at_s=issued_at_s)
    if not networks.allows(handoff.remote_host):
        # A decode engine would pull KV from (and send its engine id to) this host.
        raise InvalidHandoff(
            f"kv_transfer_params.remote_host {handoff.remote_host!r} is outside "
            "allowed_worker_networks"
        )
    return handoff


def _admission_headers(request: PreparedRequest) -> dict[str, str]:
    """Admission's prediction, for a load test (or a client) to hold against what it saw."""
    if request.predicted_ttft_s is None:
        return {}
    return {PREDICTED_TTFT_HEADER: str(round(request.predicted_ttft_s * 1000))}
