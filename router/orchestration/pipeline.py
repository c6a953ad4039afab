"""A generation request's path through the router, stage by stage.

    api -> prepare -> [fan_out] -> admit (measures the prompt: head, then whole)
        -> schedule + orchestrate -> relay

``api.py`` reads and authorizes the body and calls ``prepare``; an embeddings request
then goes to the model's embedding pool (``embed.py``), and this module runs the rest of
a generation for each choice: the pools that would serve it now, admission (one call: it has
the prompt measured with that pool's tokenizer, through ``PromptMeasures``, as far as it
needs), then the orchestrator (which asks the scheduler for each worker and relays the
answer).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from fastapi.responses import Response

from router.admission.admit import Admission, PromptMeasures
from router.errors import InvalidRequest
from router.fleet.registry import Pools, WorkerRegistry
from router.observability.metrics import RouterMetrics
from router.orchestration.embed import Embedder
from router.orchestration.orchestrate import Orchestrator
from router.prepare.fan_out import serve_choices, split_choices
from router.prepare.prepare import (
    Endpoint,
    PreparedRequest,
    PromptHead,
    Tokenized,
    measure_head,
    measure_prompt,
)
from router.prepare.prompt_blocks import BlockHashers, PromptBlocks
from router.prepare.token_prefix_cache import TokenPrefixCache
from router.settings import ServerSettings


class RequestPipeline:
    def __init__(
        self,
        settings: ServerSettings,
        *,
        registry: WorkerRegistry,
        hashers: BlockHashers,
        token_cache: TokenPrefixCache,
        admission: Admission,
        orchestrator: Orchestrator,
        embedder: Embedder,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._hashers = hashers
        self._token_cache = token_cache
        self._admission = admission
        self._orchestrator = orchestrator
        self._embedder = embedder
        self._metrics = metrics
        self._clock = clock
        self._measures = PromptMeasures(head=self._head, whole=self._measure)

    def __repr__(self) -> str:
        return f"RequestPipeline({self._admission!r}, {self._orchestrator!r})"

    async def serve(self, request: PreparedRequest) -> Response:
        if self._embedding_request(request):
            pools = self._registry.pools(request.model, self._clock(), request.version)
            return await self._embedder.serve(request, pools.embed)
        self._admission.check_limits(request)
        choices = split_choices(
            request.body, chat=request.chat, max_choices=self._settings.max_choices_per_request
        )
        if choices is None:
            return await self.serve_one(request)
        include_usage = bool((request.body.get("stream_options") or {}).get("include_usage"))
        return await serve_choices(
            choices,
            lambda body, counts_prompt: self.serve_one(
                dataclasses.replace(request, body=body, counts_prompt=counts_prompt)
            ),
            stream=request.stream, include_usage=include_usage,
        )  # fmt: skip

    async def serve_one(self, request: PreparedRequest) -> Response:
        """One choice: admission (which has the prompt measured), then the orchestrator."""
        pools = self._registry.pools(request.model, self._clock(), request.version)
        admitted = await self._admission.admit_prompt(request, pools, self._measures)
        try:
            return await self._orchestrator.serve(
                admitted.request, pools, admitted.blocks, prefilled=admitted.grant.release
            )
        finally:
            admitted.grant.release()  # a failed prefill, or a non-streamed answer

    def check_kind(self, request: PreparedRequest) -> None:
        """400 ``wrong_model_kind`` unless the model serves the request's endpoint (a batch
        line is checked before it runs)."""
        self._embedding_request(request)

    def _embedding_request(self, request: PreparedRequest) -> bool:
        """Whether ``request`` asks for embeddings; raises a 400 when its model is of the
        other kind (an embedding model generates nothing, a generative one pools nothing)."""
        embeds = self._registry.embeds(request.model)
        wanted = request.endpoint is Endpoint.EMBEDDINGS
        if embeds != wanted:
            kind = "an embedding model" if embeds else "a generative model"
            served = "/v1/embeddings" if embeds else "/v1/completions and /v1/chat/completions"
            raise InvalidRequest(
                f"model {request.model!r} is {kind}: it serves {served} only",
                param="model", code="wrong_model_kind",
            )  # fmt: skip
        return wanted

    def _head(self, request: PreparedRequest, pools: Pools) -> PromptHead | None:
        return measure_head(request, pools.first_hop, self._hashers, token_cache=self._token_cache,
                            head_chars=self._settings.early_bound_head_chars)  # fmt: skip

    async def serve_shadow(self, request: PreparedRequest) -> Response:
        """A mirrored copy (``shadow.py``): measured, scheduled and orchestrated on its
        version's workers, outside admission (it takes no tenant's rate or queue)."""
        pools = self._registry.pools(request.model, self._clock(), request.version)
        if self._embedding_request(request):
            return await self._embedder.serve(request, pools.embed, rate_limited=False)
        blocks = await self._measure(request, pools)
        return await self._orchestrator.serve(request, pools, blocks, prefilled=lambda: None)

    async def _measure(self, request: PreparedRequest, pools: Pools) -> PromptBlocks:
        def count(tokenized: Tokenized) -> None:
            metrics, model = self._metrics, request.model
            metrics.tokenize_cpu.labels(model).observe(tokenized.cpu_s)
            if tokenized.reused_chars:  # short prompts never reuse: spare them the lookup
                metrics.prompt_chars.labels(model, "reused").inc(tokenized.reused_chars)
            metrics.prompt_chars.labels(model, "tokenized").inc(
                tokenized.chars - tokenized.reused_chars
            )

        return await measure_prompt(
            request, pools.first_hop, self._hashers,
            offload_chars=self._settings.tokenize_offload_chars,
            token_cache=self._token_cache, on_tokenized=count,
        )  # fmt: skip

    def busy(self, request: PreparedRequest, shadow_version: str | None) -> bool:
        """Under load, for shadowing: the model's router queue, or the shadow's engines,
        have requests waiting."""
        queue = self._admission.queues().get(request.model)
        if queue is not None and queue.waiting:
            return True
        pools = self._registry.pools(request.model, self._clock(), shadow_version)
        workers = [*pools.prefill, *pools.decode, *pools.colocated]
        return not workers or any(w.load.num_requests_waiting > 0 for w in workers)
