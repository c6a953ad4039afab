"""The HTTP API as a table: each route, its access level, and a module-level handler.

Handlers find the router's parts on ``request.app.state.parts`` (``parts.RouterParts``),
so each can be called and tested on its own and the table can be read by tools. Access
(``access.py``) is applied from the table before a handler runs. The SRE's admin API
(``/admin/v1``) lives in ``admin_api.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from contracts.workers import HeartbeatReply, WorkerHeartbeat, WorkerRegistration
from router.batch.runner import LineReply
from router.errors import APIError, Forbidden, NotFound, Overloaded, parsed
from router.fleet.registry import RegistryFull
from router.fleet.worker_networks import OutsideNetworks
from router.http import admin_api, batch_api, rollout_api
from router.http.access import (
    Access,
    Route,
    agent_worker,
    authorized,
    parts_of,
    schema_for_clients,
)
from router.http.answer_schemas import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionResponse,
    EmbeddingResponse,
    ModelList,
)
from router.http.http_io import json_body, unless_disconnected
from router.prepare.prepare import Endpoint, prepare
from router.prepare.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from router.rollout.prepull import pull_order

if TYPE_CHECKING:
    from router.admission.tenants import Tenant
    from router.parts import RouterParts

log = logging.getLogger("pdserve.router")

_ADMIN_BODY_BYTES = 64 * 1024  # registrations and heartbeats are small
# 400s from a size limit: counted apart, so a spike of context-length abuse can alert.
LIMIT_CODES = frozenset({
    "context_length_exceeded", "model_prompt_limit", "tenant_prompt_limit",
    "model_output_limit", "tenant_output_limit", "too_many_messages", "message_too_long",
})  # fmt: skip


# -- generation -----------------------------------------------------------------


async def generate(request: Request, endpoint: Endpoint) -> Response:
    parts = parts_of(request)
    arrived_s = parts.clock()
    body = await json_body(request, parts.settings.server.max_body_bytes)
    return await serve_body(
        parts, endpoint, body, arrived_s=arrived_s, headers=request.headers,
        tenant=getattr(request.state, "tenant", None),
        watch=lambda work: unless_disconnected(request, work),
    )  # fmt: skip


async def serve_body(
    parts: RouterParts, endpoint: Endpoint, body: Any, *, arrived_s: float,
    headers: Mapping[str, str], tenant: Tenant | None,
    watch: Callable[[Awaitable[Response]], Awaitable[Response]] = lambda work: work,
    yields: bool = False,
) -> Response:  # fmt: skip
    """A request's whole path from its parsed body: a client's (``generate``), or a
    batch line's (``answer_batch_line``). ``watch`` cancels the work if the client left;
    ``yields``: admitted only onto room interactive traffic leaves (a batch line)."""
    counted = parts.metrics.requests
    try:
        prepared = prepare(
            endpoint, body, max_tokens_cap=parts.settings.server.max_tokens_cap,
            aliases=parts.aliases, served_models=parts.registry.models(), arrived_s=arrived_s,
            tenant=tenant, priority_header=headers.get("x-pdserve-priority"),
            ttft_slo_header=headers.get("x-pdserve-ttft-slo-ms"),
        )  # fmt: skip
    except NotFound:
        counted.labels("unknown", endpoint.value, "404", "prod").inc()
        raise
    if yields:
        prepared = dataclasses.replace(prepared, yields=True)
    parts.metrics.observe_arrival(prepared.requested_model, prepared.tenant_class, arrived_s)
    path = parts.rollout_path
    prepared = path.place(prepared, headers)
    shadow = None
    try:
        await path.screen_input(prepared)
        shadow = path.mirror(prepared, parts.pipeline.busy)
        response = await watch(parts.pipeline.serve(prepared))
        response = await path.screen_output(prepared, response)
    except APIError as error:
        path.answered(prepared, shadow, status=error.status)
        counted.labels(prepared.requested_model, endpoint.value, str(error.status),
                       prepared.stage).inc()  # fmt: skip
        if error.code in LIMIT_CODES:
            parts.metrics.limit_rejections.labels(prepared.requested_model, error.code).inc()
        raise
    path.answered(prepared, shadow, status=response.status_code, response=response)
    counted.labels(prepared.requested_model, endpoint.value, str(response.status_code),
                   prepared.stage).inc()  # fmt: skip
    return response


BATCH_ENDPOINTS = {"/v1/chat/completions": Endpoint.CHAT, "/v1/completions": Endpoint.COMPLETIONS,
                   "/v1/embeddings": Endpoint.EMBEDDINGS}  # fmt: skip
_BATCH_LINE = {"x-pdserve-priority": "batch"}  # below every interactive class


async def answer_batch_line(
    parts: RouterParts, path: str, body: dict, tenant_name: str, *, yields: bool
) -> LineReply:
    """A batch line through the path a client's request takes, as the batch's tenant at
    the lowest priority; ``yields``: only onto room interactive traffic leaves."""
    tenant = parts.tenants.named(tenant_name)
    try:
        response = await serve_body(
            parts, BATCH_ENDPOINTS[path], {**body, "stream": False}, arrived_s=parts.clock(),
            headers=_BATCH_LINE, tenant=tenant, yields=yields,
        )  # fmt: skip
    except APIError as error:
        return LineReply(error.status, error.json_bytes(), retry_after_s=error.retry_after_s,
                         yielded=error.code == "batch_yields")  # fmt: skip
    if isinstance(response, StreamingResponse):  # not for a whole answer; read it whole
        chunks = [c if isinstance(c, bytes) else str(c).encode()
                  async for c in response.body_iterator]  # fmt: skip
        return LineReply(response.status_code, b"".join(chunks))
    return LineReply(response.status_code, bytes(response.body))


def batch_body_check(parts: RouterParts, path: str, tenant_name: str) -> Callable[[dict], None]:
    """What a batch's validation holds each line's body to: ``prepare``'s checks (schema,
    model, the tenant's models), as a client's request of the endpoint gets them."""
    tenant = parts.tenants.named(tenant_name)

    def check(body: dict) -> None:
        prepared = prepare(
            BATCH_ENDPOINTS[path], body, max_tokens_cap=parts.settings.server.max_tokens_cap,
            aliases=parts.aliases, served_models=parts.registry.models(),
            arrived_s=parts.clock(), tenant=tenant,
        )  # fmt: skip
        parts.pipeline.check_kind(prepared)

    return check


async def completions(request: Request) -> Response:
    return await generate(request, Endpoint.COMPLETIONS)


async def chat_completions(request: Request) -> Response:
    return await generate(request, Endpoint.CHAT)


async def embeddings(request: Request) -> Response:
    """Through the same route, stages and screens as a generation; served by the model's
    embedding pool (``orchestration/embed.py``)."""
    return await generate(request, Endpoint.EMBEDDINGS)


async def list_models(request: Request) -> dict[str, Any]:
    """Model ids (and aliases) only: versions are the route's business (admins see them
    at ``GET /admin/v1/models``). A tenant limited to some models sees only those. A model
    is listed once a request to it can be answered (a ready prefill and decode worker, or
    a colocated one): clients that wait for it here, as vLLM's own clients do, may then
    send at once."""
    parts = parts_of(request)
    served = parts.registry.servable_models(parts.clock())
    listed = [alias for alias, model in parts.aliases.items() if model in served]
    tenant = getattr(request.state, "tenant", None)
    names = [
        name for name in [*served, *listed]
        if tenant is None or tenant.may_use(name, parts.aliases.get(name, name))
    ]  # fmt: skip
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "pdserve"} for name in names
        ],
    }


# -- operations -----------------------------------------------------------------


async def health(request: Request) -> dict[str, str]:
    del request  # every handler takes the request: guarded() passes it by name
    return {"status": "ok"}


async def openapi_document(request: Request) -> dict[str, Any]:
    """The API's schema: public and client routes for anyone, the admin API too for a
    viewer (it names every admin route and body)."""
    spec = request.app.openapi()
    return spec if authorized(request, Access.VIEWER) else schema_for_clients(spec, ROUTES)


async def prometheus_metrics(request: Request) -> Response:
    return Response(parts_of(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


# -- workers (agents register and heartbeat here) -------------------------------


def _own_worker(request: Request, worker_id: str) -> None:
    """An agent acts for the worker id its token was minted for, and no other."""
    if agent_worker(request) != worker_id:
        raise Forbidden(
            f"this agent's token is not for worker {worker_id!r}", code="not_this_agents_worker"
        )


async def _check_hosts(request: Request, registration: WorkerRegistration) -> None:
    networks = parts_of(request).networks
    try:
        await networks.check_url(registration.engine_url, "engine_url")
        if registration.kv_events_endpoint:
            await networks.check_url(registration.kv_events_endpoint, "kv_events_endpoint")
    except OutsideNetworks as error:
        raise Forbidden(str(error), code="worker_outside_allowed_networks") from None


async def register_worker(request: Request) -> dict[str, Any]:
    parts = parts_of(request)
    registration = parsed(WorkerRegistration, await json_body(request, _ADMIN_BODY_BYTES))
    _own_worker(request, registration.worker_id)
    await _check_hosts(request, registration)
    parts.rollout.rollout.check_worker(registration)
    previous = parts.registry.get(registration.worker_id)
    try:
        parts.registry.register(registration, parts.clock())
    except RegistryFull as error:
        raise Overloaded(str(error), retry_after_s=parts.settings.server.retry_after_s) from None
    new_incarnation = (
        previous is None or previous.registration.incarnation != registration.incarnation
    )
    parts.on_registered(registration, new_incarnation)
    if new_incarnation:
        parts.accounting.registered(registration)
    await parts.sync.registered(registration)
    log.info("worker %s registered (%s)", registration.worker_id, registration.role.value)
    return {"registered": registration.worker_id}


async def heartbeat(request: Request) -> Response:
    parts = parts_of(request)
    beat = parsed(WorkerHeartbeat, await json_body(request, _ADMIN_BODY_BYTES))
    _own_worker(request, beat.worker_id)
    if not parts.registry.heartbeat(beat, parts.clock()):
        raise NotFound(f"worker {beat.worker_id!r} is not registered; register first",
                       code="worker_not_registered")  # fmt: skip
    worker = parts.registry.get(beat.worker_id)
    if worker is not None:
        parts.accounting.heartbeat(worker.registration, beat)
    await parts.sync.heartbeat(beat)
    pull = None
    if worker is not None:
        pull = pull_order(parts.rollout.rollout, worker, parts.registry.workers)
    reply = HeartbeatReply(role=parts.pools.wanted_role(beat.worker_id), pull=pull)
    return JSONResponse(reply.model_dump(mode="json"))


async def deregister_worker(request: Request, worker_id: str) -> dict[str, Any]:
    parts = parts_of(request)
    _own_worker(request, worker_id)
    if not parts.registry.deregister(worker_id):
        raise NotFound(f"no worker {worker_id!r} is registered", code="worker_not_found")
    parts.forget_worker(worker_id)
    await parts.sync.removed(worker_id)
    log.info("worker %s deregistered", worker_id)
    return {"deregistered": worker_id}


async def list_workers(request: Request) -> dict[str, Any]:
    parts = parts_of(request)
    now = parts.clock()
    return {
        "workers": [
            {
                **w.registration.model_dump(mode="json"),
                "eligible": parts.registry.is_eligible(w, now),
                "ready": w.ready,
                "healthy": w.healthy,
                "circuit": w.breaker.state(now).value,
                "draining": w.draining,
                "seen_s_ago": round(now - w.last_seen_s, 3),
                "load": w.load.model_dump(),
            }
            for w in parts.registry.workers()
        ]
    }


ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/v1/completions",
        completions,
        Access.CLIENT,
        body=CompletionRequest,
        answer=CompletionResponse,
        stream_chunk=CompletionChunk,
        hot=True,
    ),
    Route(
        "POST",
        "/v1/chat/completions",
        chat_completions,
        Access.CLIENT,
        body=ChatCompletionRequest,
        answer=ChatCompletionResponse,
        stream_chunk=ChatCompletionChunk,
        hot=True,
    ),
    Route(
        "POST",
        "/v1/embeddings",
        embeddings,
        Access.CLIENT,
        body=EmbeddingRequest,
        answer=EmbeddingResponse,
        hot=True,
    ),
    Route("GET", "/v1/models", list_models, Access.CLIENT, answer=ModelList),
    Route("GET", "/health", health, Access.PUBLIC),
    Route("GET", "/metrics", prometheus_metrics, Access.PUBLIC),
    Route("GET", "/openapi.json", openapi_document, Access.PUBLIC),
    Route(
        "POST", "/admin/workers/register", register_worker, Access.AGENT, body=WorkerRegistration
    ),
    Route("POST", "/admin/workers/heartbeat", heartbeat, Access.AGENT, body=WorkerHeartbeat),
    Route("DELETE", "/admin/workers/{worker_id}", deregister_worker, Access.AGENT),
    Route("GET", "/admin/workers", list_workers, Access.VIEWER),
    *admin_api.ROUTES,
    *rollout_api.ROUTES,
    *batch_api.ROUTES,
)
