"""The embeddings path: ``/v1/embeddings`` on a model's embedding pool.

An embedding worker (vLLM's pooling runner) keeps no KV that a later request reuses,
so there is no prefix to route by: a request goes to the least-loaded worker (the
router's own requests in flight there, then what the engine last reported running and
waiting). vLLM validates the inputs and answers: its answer, or its error with its
status (an empty input, one past the context), goes back unchanged. A worker that
fails (unreachable, a 5xx) is counted as on the generation path (``worker_outcomes.py``)
and the request goes to another, ``embedding_retries`` times at most.

Before any worker is asked, a tenant with a tokens-per-minute limit has the inputs
counted with the model's tokenizer (token ids as they are) and charged to it, as a
prompt is (a tenant without one is not made to wait for a count nothing reads); a
request of more than ``max_embedding_inputs`` inputs is refused.

A request of at least twice ``embedding_split_min_inputs`` inputs, while other
workers of the pool are idle, is cut into contiguous pieces sent to them at once and
merged in order (``embedding_split.py``); each piece fails over on its own, and the
first piece that fails for good fails the request and stops the others.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.responses import Response

from contracts.tokenization import load_tokenizer
from router.admission.admit import Admission
from router.errors import InvalidRequest, NoCapacity, RequestTooLarge, UpstreamFailed
from router.fleet.registry import WorkerRegistry, WorkerState
from router.observability.metrics import RouterMetrics
from router.orchestration.embedding_split import merge_answers, split_points
from router.orchestration.engine_body import engine_json
from router.orchestration.engine_client import EngineClient
from router.orchestration.engine_errors import EngineHTTPError, EngineUnreachable
from router.orchestration.usage import usage_in_large_answer
from router.orchestration.worker_outcomes import WorkerOutcomes
from router.prepare.prepare import PreparedRequest
from router.scheduling.load import InFlightLoad
from router.settings import RouterSettings

EMBEDDINGS_PATH = "/v1/embeddings"
Inputs = list[str] | list[list[int]]


class Embedder:
    def __init__(
        self,
        *,
        settings: RouterSettings,
        registry: WorkerRegistry,
        engines: EngineClient,
        admission: Admission,
        load: InFlightLoad,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._max_inputs = settings.server.max_embedding_inputs
        self._split_min = settings.server.embedding_split_min_inputs
        self._offload_chars = settings.server.tokenize_offload_chars
        self._timeout_s = settings.upstream.embedding_timeout_s
        self._retries = settings.upstream.embedding_retries
        self._retry_after_s = settings.server.retry_after_s
        self._engines = engines
        self._admission = admission
        self._load = load
        self._metrics = metrics
        self._clock = clock
        self._rng = rng or random.Random()
        self._outcomes = WorkerOutcomes(registry, metrics, clock)
        # When this router last heard back from each worker: an engine report older
        # than that describes this router's own finished work (``_pieces``).
        self._answered_at: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"Embedder(max_inputs={self._max_inputs}, split_min={self._split_min})"

    async def serve(
        self, request: PreparedRequest, pool: Sequence[WorkerState], *, rate_limited: bool = True
    ) -> Response:
        """Answer ``request`` on ``pool``; ``rate_limited`` off for a shadow's copy."""
        inputs = _inputs(request.body.get("input"))
        if len(inputs) > self._max_inputs:
            raise RequestTooLarge(
                f"{len(inputs)} inputs; at most {self._max_inputs} are accepted per request",
                param="input", code="too_many_inputs",
            )  # fmt: skip
        if not pool:
            raise NoCapacity(
                f"no ready embedding worker for model {request.model!r}; retry shortly",
                code="no_ready_worker", retry_after_s=self._retry_after_s,
            )  # fmt: skip
        tokens = 0
        if rate_limited:
            if request.tenant.policy.tpm:
                tokens = await self._count(inputs, pool)
            await self._admission.rate_limit(request, tokens)
        pieces = self._pieces(inputs, pool)
        if len(pieces) == 1:
            payload = await self._ask(request, request.body, pool, tokens)
        else:
            payload = await self._ask_in_pieces(request, inputs, pieces, pool, tokens)
        self._observe(request, payload)
        return Response(content=payload, media_type="application/json")

    def _pieces(
        self, inputs: Inputs, pool: Sequence[WorkerState]
    ) -> list[tuple[slice, WorkerState | None]]:
        """Where each piece goes: one piece (to the least-loaded worker) unless other
        workers are idle: none of this router's requests on them, and, in their engine's
        last report, nothing running or waiting, unless that report is older than this
        router's last answer from the worker. A heartbeat taken during the request that
        just ended still shows it, for up to an interval, and would keep back-to-back
        requests whole (benchmarks/embeddings.py saw it, twice: one input list is as
        many engine requests, so its waiting count lingers too)."""
        if self._split_min <= 0 or len(inputs) < 2 * self._split_min:
            return [(slice(0, len(inputs)), None)]
        for gone in set(self._answered_at) - {w.worker_id for w in pool}:
            del self._answered_at[gone]  # bounded by the pool

        def idle(worker: WorkerState) -> bool:
            if self._load.of(worker.worker_id).requests:
                return False
            engine = worker.load
            fresh = worker.last_seen_s > self._answered_at.get(worker.worker_id, 0.0) + 0.25
            return not fresh or engine.num_requests_running + engine.num_requests_waiting == 0

        slices = split_points(len(inputs), sum(map(idle, pool)), self._split_min)
        if len(slices) == 1:
            return [(slices[0], None)]
        return list(zip(slices, filter(idle, pool), strict=False))

    async def _ask_in_pieces(
        self, request: PreparedRequest, inputs: Inputs,
        pieces: list[tuple[slice, WorkerState | None]], pool: Sequence[WorkerState], tokens: int,
    ) -> bytes:  # fmt: skip
        self._metrics.embedding_splits.labels(request.model, str(len(pieces))).inc()
        tasks = []
        for part, worker in pieces:
            body = {**request.body, "input": inputs[part]}
            share = tokens * (part.stop - part.start) // len(inputs)
            tasks.append(asyncio.create_task(self._ask(request, body, pool, share, first=worker)))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()
        failed = next((t.exception() for t in tasks if t.done() and not t.cancelled()
                       and t.exception() is not None), None)  # fmt: skip
        if failed is not None:
            raise failed
        return merge_answers([t.result() for t in tasks], [part.start for part, _ in pieces])

    async def _ask(
        self, request: PreparedRequest, body: dict[str, Any], pool: Sequence[WorkerState],
        tokens: int, first: WorkerState | None = None,
    ) -> bytes:  # fmt: skip
        """One worker's answer to ``body`` (of ``request``): ``first`` (else the least
        loaded), then others on failure, ``embedding_retries`` times at most."""
        tried: list[str] = []
        failures: list[str] = []
        while len(tried) <= self._retries:
            worker = first if first is not None and not tried else self._least_loaded(pool, tried)
            if worker is None:
                break
            tried.append(worker.worker_id)
            self._metrics.routed_requests.labels(worker.worker_id, "embed").inc()
            try:
                with self._load.begin(worker.worker_id, tokens):
                    payload = await self._engines.post_json(
                        worker.engine_url + EMBEDDINGS_PATH, engine_json(body, request, worker),
                        timeout_s=self._timeout_s,
                    )  # fmt: skip
            except (EngineUnreachable, EngineHTTPError) as error:
                failures.append(self._outcomes.triage(worker, error))  # a 4xx is re-raised
                continue
            finally:
                self._answered_at[worker.worker_id] = self._clock()
            self._outcomes.answered(worker)
            return payload
        raise UpstreamFailed("embedding failed: " + "; ".join(failures), code="embedding_failed")

    def _least_loaded(self, pool: Sequence[WorkerState], tried: list[str]) -> WorkerState | None:
        candidates = [w for w in pool if w.worker_id not in tried]
        if not candidates:
            return None

        def load(worker: WorkerState) -> tuple[int, float, float]:
            engine = worker.load
            running = engine.num_requests_running + engine.num_requests_waiting
            return self._load.of(worker.worker_id).requests, running, self._rng.random()

        return min(candidates, key=load)

    async def _count(self, inputs: Inputs, pool: Sequence[WorkerState]) -> int:
        """The inputs' tokens, as the engine will count them (its tokenizer, with its
        special tokens); 0 when no worker names its tokenizer."""
        path = next((w.registration.tokenizer_path for w in pool if w.registration.tokenizer_path),
                    None)  # fmt: skip
        if path is None:
            return 0
        tokenizer = load_tokenizer(str(path))

        def count() -> int:
            return sum(
                len(x) if isinstance(x, list) else len(tokenizer.encode(x, add_special_tokens=True))
                for x in inputs
            )

        chars = sum(len(x) for x in inputs if isinstance(x, str))
        return await asyncio.to_thread(count) if chars > self._offload_chars else count()

    def _observe(self, request: PreparedRequest, payload: bytes) -> None:
        usage = usage_in_large_answer(payload)
        if usage is None:
            return
        self._metrics.observe_usage(request.model, request.tenant_class, usage, counts_prompt=True)
        seconds = self._clock() - request.arrived_s
        self._metrics.observe_embedding(request.model, request.tenant_class, seconds, request.stage)


def _inputs(value: Any) -> Inputs:
    """OpenAI's four shapes of ``input``, as a list of inputs (validated by the schema)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return [value]
    if isinstance(value, list):
        return value
    raise InvalidRequest("input must be a string, a list of strings or token ids", param="input")
