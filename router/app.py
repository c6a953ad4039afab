"""``create_app(settings)``: builds every router component and wires the HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from contracts.workers import WorkerHeartbeat, WorkerRegistration
from router.background import keep_running
from router.errors import (
    APIError,
    ClientDisconnected,
    Forbidden,
    InvalidRequest,
    NotFound,
    Overloaded,
    RequestTooLarge,
    Unauthorized,
)
from router.fan_out import serve_choices, split_choices
from router.health import probe_engines_forever
from router.metrics import RouterMetrics
from router.orchestrator import GenerationCall, Orchestrator
from router.registry import RegistryFull, WorkerRegistry
from router.schemas import ChatCompletionRequest, CompletionRequest, validate
from router.settings import RouterSettings
from router.upstream import Upstream
from router.worker_selection import WorkerSelector

log = logging.getLogger("pdserve.router")


def create_app(settings: RouterSettings, *, clock: Callable[[], float] = time.monotonic) -> FastAPI:
    registry = WorkerRegistry(
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        forget_after_s=settings.forget_after_s,
        max_workers=settings.max_workers,
    )
    upstream = Upstream(
        pool_size=settings.upstream_pool_size,
        connect_timeout_s=settings.upstream_connect_timeout_s,
        keepalive_s=settings.upstream_keepalive_s,
    )
    selector = WorkerSelector(settings, clock=clock)
    aliases = settings.aliases()  # parsed once, not per request
    metrics = RouterMetrics(registry, selector, clock)
    orchestrator = Orchestrator(
        settings=settings, registry=registry, upstream=upstream, metrics=metrics,
        selector=selector, clock=clock,
    )  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await upstream.start()

        def probe() -> Awaitable[None]:
            return probe_engines_forever(
                registry,
                lambda: upstream.session,
                interval_s=settings.health_interval_s,
                timeout_s=settings.health_timeout_s,
                failures_to_eject=settings.health_failures_to_eject,
                clock=clock,
                on_forgotten=selector.on_gone,
            )

        def expire() -> Awaitable[None]:
            return _expire_forever(selector, settings.prefix_expire_interval_s)

        crashed = metrics.background_restarts.labels
        prober, sweeper = (
            asyncio.create_task(keep_running(name, loop, on_crash=lambda n: crashed(n).inc()))
            for name, loop in (("health_probe", probe), ("prefix_expiry", expire))
        )
        try:
            yield
        finally:
            for task in (prober, sweeper):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await selector.feed.close()
            await upstream.close()

    app = FastAPI(title="pdserve router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.registry = registry
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def _api_error(_: Request, error: APIError) -> Response:
        return Response(
            content=error.json_bytes(),
            status_code=error.status,
            media_type="application/json",
            headers=error.headers(),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return await _api_error(request, APIError("internal router error; see router log"))

    def authorize_client(request: Request) -> None:
        if settings.api_keys and not _bearer_in(request, settings.api_keys):
            raise Unauthorized("missing or invalid API key", code="invalid_api_key")

    def authorize_admin(request: Request) -> None:
        if not settings.admin_token:
            raise Forbidden("the admin API is disabled: set PDSERVE_ADMIN_TOKEN on the router")
        if not _bearer_in(request, (settings.admin_token,)):
            raise Unauthorized("missing or invalid admin token", code="invalid_admin_token")

    async def generation(request: Request, path: str, schema: type) -> Response:
        arrived_s = clock()
        authorize_client(request)
        body = await _json_body(request, settings.max_body_bytes)
        parsed = validate(schema, body, max_tokens_cap=settings.max_tokens_cap)
        endpoint = "chat" if "chat" in path else "completions"
        served = aliases.get(parsed.model, parsed.model)
        if served != parsed.model:
            body = {**body, "model": served}  # engines know the served name only
        if served not in registry.models():
            metrics.requests.labels("unknown", endpoint, "404").inc()
            raise NotFound(
                f"model {parsed.model!r} is not served here; see GET /v1/models",
                param="model",
                code="model_not_found",
            )
        call = GenerationCall(
            path=path, body=body, model=served, stream=parsed.stream, arrived_s=arrived_s,
            requested_model=parsed.model,
        )  # fmt: skip
        choices = split_choices(body, chat=call.chat, max_choices=settings.max_choices_per_request)
        if choices is None:
            work = orchestrator.serve(call)
        else:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            work = serve_choices(
                choices, lambda sub: orchestrator.serve(dataclasses.replace(call, body=sub)),
                stream=call.stream, include_usage=include_usage,
            )  # fmt: skip
        try:
            response = await _unless_disconnected(request, work)
        except APIError as error:
            metrics.requests.labels(parsed.model, endpoint, str(error.status)).inc()
            raise
        metrics.requests.labels(parsed.model, endpoint, str(response.status_code)).inc()
        return response

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generation(request, "/v1/completions", CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generation(request, "/v1/chat/completions", ChatCompletionRequest)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize_client(request)
        served = registry.models()
        listed = [a for a, model in aliases.items() if model in served]
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "pdserve"}
                for name in [*served, *listed]
            ],
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.prometheus), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/workers/register")
    async def register(request: Request) -> dict[str, Any]:
        authorize_admin(request)
        registration = _parse(WorkerRegistration, await _json_body(request, 64 * 1024))
        previous = registry.get(registration.worker_id)
        try:
            registry.register(registration, clock())
        except RegistryFull as error:
            raise Overloaded(str(error), retry_after_s=settings.retry_after_s) from None
        selector.on_registered(
            registration,
            new_incarnation=previous is None
            or previous.registration.incarnation != registration.incarnation,
        )
        log.info("worker %s registered (%s)", registration.worker_id, registration.role.value)
        return {"registered": registration.worker_id}

    @app.post("/admin/workers/heartbeat")
    async def heartbeat(request: Request) -> Response:
        authorize_admin(request)
        beat = _parse(WorkerHeartbeat, await _json_body(request, 64 * 1024))
        if not registry.heartbeat(beat, clock()):
            return JSONResponse({"error": "unknown worker; register first"}, status_code=404)
        return JSONResponse({"ok": True})

    @app.delete("/admin/workers/{worker_id}")
    async def deregister(request: Request, worker_id: str) -> dict[str, Any]:
        authorize_admin(request)
        if not registry.deregister(worker_id):
            raise NotFound(f"no worker {worker_id!r} is registered", code="worker_not_found")
        selector.on_gone(worker_id)
        log.info("worker %s deregistered", worker_id)
        return {"deregistered": worker_id}

    @app.get("/admin/workers")
    async def list_workers(request: Request) -> dict[str, Any]:
        authorize_admin(request)
        now = clock()
        return {
            "workers": [
                {
                    **w.registration.model_dump(mode="json"),
                    "eligible": registry.is_eligible(w, now),
                    "ready": w.ready,
                    "healthy": w.healthy,
                    "draining": w.draining,
                    "seen_s_ago": round(now - w.last_seen_s, 3),
                    "load": w.load.model_dump(),
                }
                for w in registry.workers()
            ]
        }

    return app


async def _expire_forever(selector: WorkerSelector, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        selector.expire()


def _bearer_in(request: Request, accepted: tuple[str, ...]) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return any(hmac.compare_digest(token.encode(), key.encode()) for key in accepted)


async def _json_body(request: Request, max_bytes: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestTooLarge(f"request body over {max_bytes} bytes", code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestTooLarge(f"request body over {max_bytes} bytes", code="body_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as error:
        raise InvalidRequest(f"request body is not valid JSON: {error}") from None


def _parse(model: type, body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise InvalidRequest(f"invalid {model.__name__}: {error.errors()[0]['msg']}") from None


async def _unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """Run ``work``, cancelling it (and so its upstream calls) if the client leaves.

    Starlette only watches for disconnects while a response streams; before
    that, a departed client would otherwise keep a prefill running for nobody.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientDisconnected("client disconnected before the answer", code="client_gone")
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
