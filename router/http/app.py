"""``create_app(settings)``: builds the router's parts and serves the API table on them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import StarletteHTTPException as HTTPException
from fastapi.responses import Response

from contracts.safety import HookCheck
from contracts.workers import WorkerRegistration
from router.admission.admit import Admission
from router.admission.tenants import Tenants
from router.admission.ttft_predictor import TTFTPredictor
from router.batch.runner import BatchRunner, LineReply, RunnerLimits
from router.batch.tier import build_batch_tier
from router.errors import APIError, InvalidRequest, MethodNotAllowed, NotFound
from router.fleet.background import keep_running
from router.fleet.health import StallCheck, probe_engines_forever
from router.fleet.pool_control import PoolController
from router.fleet.registry import WorkerRegistry, WorkerState
from router.fleet.scalers import configured_scaler
from router.fleet.state_sync import StateSync
from router.fleet.worker_networks import WorkerNetworks
from router.http.access import body_components, guarded, openapi_extra
from router.http.api import ROUTES, answer_batch_line, batch_body_check
from router.http.fast_path import HotRoutes
from router.http.request_ids import RequestIds
from router.observability.fleet_accounting import FleetAccounting
from router.observability.loop_health import measure_loop_lag_forever, watch_gc_pauses
from router.observability.metric_views import (
    SharedStateCollector,
    WorkerCollector,
    derived,
    process_gauge_publisher,
)
from router.observability.metrics import RouterMetrics
from router.observability.windows import SlidingSums
from router.orchestration.embed import Embedder
from router.orchestration.engine_client import EngineClient, engine_address
from router.orchestration.engine_errors import EngineHTTPError, EngineUnreachable
from router.orchestration.orchestrate import Orchestrator
from router.orchestration.pipeline import RequestPipeline
from router.orchestration.upstream import Upstream
from router.parts import RouterParts, forget_worker
from router.prepare.prompt_blocks import BlockHashers
from router.prepare.token_prefix_cache import TokenPrefixCache
from router.rollout.review import ReviewQueue
from router.rollout.rollout import Rollout
from router.rollout.rollout_control import RolloutControl
from router.rollout.rollout_path import RolloutPath
from router.rollout.shadow import ShadowMirror
from router.scheduling.load import InFlightLoad
from router.scheduling.prefix_tracking import PrefixTracker
from router.scheduling.routing_stats import RoutingStats
from router.scheduling.schedule import Scheduler
from router.settings import RouterSettings
from router.state.base import ControlState, StateLimits, StateUnavailable
from router.state.memory import MemoryState
from router.state.redis_backend import RedisState

log = logging.getLogger("pdserve.router")


def build_parts(settings: RouterSettings, clock: Callable[[], float]) -> RouterParts:
    health, routing = settings.health, settings.routing
    registry = WorkerRegistry(**health.registry_arguments())
    upstream = Upstream(**settings.upstream.pool_arguments())
    load = InFlightLoad()
    observe = settings.metrics
    metrics = _metrics(settings, clock)
    stats = RoutingStats(
        hotspot_window_requests=routing.hotspot_window_requests, on_routed=metrics.count_routed
    )
    prefixes = PrefixTracker(settings.index, clock=clock, on_event=stats.kv_event)
    accounting = FleetAccounting(
        observe.prices(), max_gap_s=health.heartbeat_timeout_s, clock=clock, sink=metrics,
        window=SlidingSums(window_s=observe.metrics_window_s, bucket_s=1.0, clock=clock),
    )  # fmt: skip
    admission_settings = settings.admission
    predictor = TTFTPredictor(prior_tokens_per_s=admission_settings.prior_prefill_tokens_per_s)
    scheduler = Scheduler(
        routing, load=load, prefixes=prefixes, stats=stats,
        kv_overcommit=admission_settings.decode_kv_overcommit,
        preemption_cooldown_s=admission_settings.preemption_cooldown_s, predictor=predictor,
        clock=clock,
    )  # fmt: skip
    networks = WorkerNetworks(settings.server.allowed_worker_networks)
    orchestrator = Orchestrator(
        settings=settings, registry=registry, engines=upstream.engines, metrics=metrics,
        scheduler=scheduler, load=load, predictor=predictor, networks=networks, clock=clock,
    )  # fmt: skip
    state = _state(settings)
    rollout = RolloutControl(
        state, Rollout(), metrics.stages, wall_clock=time.time,
        on_rollback=lambda model: metrics.canary_rollbacks.labels(model).inc(),
    )  # fmt: skip
    registered = _on_registered(prefixes, predictor)
    sync, pools = _control_plane(settings, state, registry, load, stats, prefixes, clock,
                                 on_document=rollout.reload, on_registered=registered)  # fmt: skip
    admission = Admission(
        admission_settings, state=state, scheduler=scheduler, load=load, predictor=predictor,
        metrics=metrics, clock=clock, head_chars=settings.server.early_bound_head_chars,
        rest_samples=settings.server.early_bound_rest_samples,
    )  # fmt: skip
    pipeline = _pipeline(settings, registry, admission, orchestrator, metrics, clock,
                         engines=upstream.engines, load=load)  # fmt: skip
    path = _rollout_path(settings, rollout, state, pipeline, metrics, upstream, clock, registry)
    _wire_metrics(metrics, registry, prefixes, stats, clock, process_gauge_publisher(
        metrics, registry=registry, load=load, stats=stats, queues=admission.queues,
        accounting=accounting, backend_up=lambda: sync.backend_up, engines=upstream.engines,
        predictor=predictor))  # fmt: skip
    return RouterParts(
        settings=settings, clock=clock, aliases=routing.aliases(), registry=registry,
        upstream=upstream, load=load, stats=stats, prefixes=prefixes, metrics=metrics,
        pipeline=pipeline, state=state, sync=sync, pools=pools,
        admin_tokens=_admin_tokens(settings), networks=networks, tenants=_tenants(settings),
        accounting=accounting, admission=admission, rollout=rollout, rollout_path=path,
        review=path.review, on_registered=registered,
        batch=build_batch_tier(settings.batch, state),
    )  # fmt: skip


def _metrics(settings: RouterSettings, clock: Callable[[], float]) -> RouterMetrics:
    observe = settings.metrics
    return RouterMetrics(
        window_s=observe.metrics_window_s, recent_ttft_samples=observe.recent_ttft_samples,
        clock=clock, stage_samples=settings.rollout.rollout_samples_kept,
        arrival_clump_window_s=observe.arrival_clump_window_s,
    )  # fmt: skip


def _pipeline(
    settings: RouterSettings, registry: WorkerRegistry, admission: Admission,
    orchestrator: Orchestrator, metrics: RouterMetrics, clock: Callable[[], float], *,
    engines: EngineClient, load: InFlightLoad,
) -> RequestPipeline:  # fmt: skip
    embedder = Embedder(settings=settings, registry=registry, engines=engines,
                        admission=admission, load=load, metrics=metrics, clock=clock)  # fmt: skip
    return RequestPipeline(
        settings.server, registry=registry, admission=admission, orchestrator=orchestrator,
        embedder=embedder, metrics=metrics, clock=clock,
        hashers=BlockHashers(memo_entries=settings.index.block_hash_memo_entries),
        token_cache=TokenPrefixCache(
            max_tokens=settings.server.token_prefix_cache_tokens,
            stride_chars=settings.server.token_prefix_stride_chars,
        ),
    )  # fmt: skip


def _on_registered(
    prefixes: PrefixTracker, predictor: TTFTPredictor
) -> Callable[[WorkerRegistration, bool], None]:
    """What a (re)registration changes here and on every replica that hears of it."""

    def registered(registration: WorkerRegistration, new_incarnation: bool) -> None:
        prefixes.on_registered(registration, new_incarnation=new_incarnation)
        if new_incarnation:  # a fresh engine: its probe, not the old engine's prefills
            predictor.seed(registration.worker_id, registration.prefill_probe)

    return registered


def _wire_metrics(
    metrics: RouterMetrics,
    registry: WorkerRegistry,
    prefixes: PrefixTracker,
    stats: RoutingStats,
    clock: Callable[[], float],
    publisher: Callable[[], None],
) -> None:
    metrics.share(WorkerCollector(registry, clock))
    metrics.share(SharedStateCollector(registry, prefixes.index, stats))
    metrics.on_publish(publisher)
    metrics.derive_with(derived)


def _rollout_path(
    settings: RouterSettings,
    rollout: RolloutControl,
    state: ControlState,
    pipeline: RequestPipeline,
    metrics: RouterMetrics,
    upstream: Upstream,
    clock: Callable[[], float],
    registry: WorkerRegistry,
) -> RolloutPath:
    shadow = ShadowMirror(
        pipeline.serve_shadow, max_inflight=settings.rollout.shadow_max_inflight,
        timeout_s=settings.rollout.shadow_timeout_s,
        records_kept=settings.rollout.shadow_records_kept,
        count=lambda model, outcome: metrics.shadow_requests.labels(model, outcome).inc(),
        clock=clock, wall_clock=time.time,
    )  # fmt: skip
    return RolloutPath(
        rollout.rollout, review=ReviewQueue(state, wall_clock=time.time), shadow=shadow,
        metrics=metrics, call_hook=_hook_caller(upstream), clock=clock,
        workers=registry.workers,
    )  # fmt: skip


def _state(settings: RouterSettings) -> ControlState:
    limits = StateLimits(
        max_workers=settings.health.max_workers,
        max_audit_entries=settings.control.audit_entries_kept,
        max_review_items=settings.rollout.review_items_kept,
    )
    url = settings.control.state_url
    return RedisState(url, limits) if url else MemoryState(limits)


def _batch_runner(parts: RouterParts) -> BatchRunner:
    """The runner sends lines through ``api.answer_batch_line``: the path a client's
    request takes, as the batch's tenant at the lowest priority."""
    settings = parts.settings

    async def answer(path: str, body: dict, tenant: str, yields: bool) -> LineReply:
        return await answer_batch_line(parts, path, body, tenant, yields=yields)

    limits = RunnerLimits(
        poll_s=settings.batch.batch_poll_s, lease_s=settings.batch.batch_lease_s,
        max_active=settings.batch.batch_max_active,
        max_in_flight=settings.batch.batch_max_in_flight,
        max_lines=settings.batch.max_batch_lines, max_body_bytes=settings.server.max_body_bytes,
    )  # fmt: skip
    return BatchRunner(
        book=parts.batch.book, state=parts.state, files=parts.batch.files, answer=answer,
        body_checks=lambda path, tenant: batch_body_check(parts, path, tenant), limits=limits,
        meters=parts.metrics,
    )  # fmt: skip


def _hook_caller(upstream: Upstream) -> Callable[[HookCheck, dict[str, Any]], Awaitable[Any]]:
    """Safety hooks are called through the engines' connection pool; any failure is a
    ``ValueError`` the screen resolves by the hook's ``on_failure``."""

    async def call(hook: HookCheck, payload: dict[str, Any]) -> Any:
        try:
            raw = await upstream.post_json(
                hook.url, json.dumps(payload).encode(), timeout_s=hook.timeout_s
            )
        except (EngineUnreachable, EngineHTTPError) as error:
            raise ValueError(str(error)) from None
        return json.loads(raw)

    return call


def _control_plane(
    settings: RouterSettings,
    state: ControlState,
    registry: WorkerRegistry,
    load: InFlightLoad,
    stats: RoutingStats,
    prefixes: PrefixTracker,
    clock: Callable[[], float],
    *,
    on_document: Callable[[str | None], Awaitable[None]],
    on_registered: Callable[[WorkerRegistration, bool], None],
) -> tuple[StateSync, PoolController]:
    def forget(worker_id: str) -> None:
        forget_worker(worker_id, prefixes=prefixes, load=load, stats=stats)

    sync = StateSync(
        state, registry=registry, record_ttl_s=settings.health.forget_after_s,
        on_registered=on_registered, on_gone=forget,
        on_control=lambda wanted: pools.adopt(wanted),
        settled=lambda worker_id, role: pools.settled(worker_id, role),
        wanted=lambda: pools.wanted(), on_document=on_document, clock=clock,
    )  # fmt: skip
    scaler = configured_scaler(
        settings.control, registry=registry, load=load, blocks_held=prefixes.index.blocks_held,
        clock=clock,
    )  # fmt: skip
    pools = PoolController(
        settings.control, registry=registry, state=state, publish=sync.publish_control,
        scaler=scaler,
    )  # fmt: skip
    return sync, pools


def _tenants(settings: RouterSettings) -> Tenants:
    admission = settings.admission
    return Tenants(admission.tenant_policies(), default=admission.default_tenant())


def _admin_tokens(settings: RouterSettings) -> dict[str, tuple[str, str]]:
    tokens = settings.control.scoped_tokens()
    if settings.server.admin_token:
        tokens[settings.server.admin_token] = ("admin", "admin")
    return tokens


def create_app(settings: RouterSettings, *, clock: Callable[[], float] = time.monotonic) -> FastAPI:
    parts = build_parts(settings, clock)
    # /openapi.json is a route of the table (``api.openapi_document``): who asks decides
    # how much of the API it shows.
    app = FastAPI(title="pdserve router", lifespan=_lifespan(parts), docs_url=None,
                  redoc_url=None, openapi_url=None)  # fmt: skip
    app.state.parts = parts
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _routing_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
    for route in ROUTES:
        app.add_api_route(
            route.path, guarded(route), methods=[route.method], openapi_extra=openapi_extra(route)
        )
    _document_bodies(app)
    # Starlette runs the last added outermost: request ids first, then the hot routes.
    app.add_middleware(HotRoutes, routes=ROUTES, api_error=_api_error, unexpected=_unexpected)
    app.add_middleware(RequestIds)
    return app


def _document_bodies(app: FastAPI) -> None:
    """Add the models nested in the request bodies to /openapi.json's components."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            spec = generate()
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(body_components(ROUTES))
            # Path parameters are plain strings and bodies are validated by the handlers:
            # FastAPI's 422 (its own error shape) is never answered, so it is not listed.
            for operations in spec.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]


def _lifespan(parts: RouterParts) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager]:
    settings = parts.settings

    def probe() -> Awaitable[None]:
        return _probe_forever(parts)

    def expire() -> Awaitable[None]:
        return _expire_forever(parts.prefixes, settings.index.prefix_expire_interval_s)

    async def publish_metrics() -> None:
        # With several router processes, a process's gauges are read by whichever one
        # serves the scrape: keep them current (its windows roll even without traffic).
        while True:
            await asyncio.sleep(1.0)
            parts.metrics.publish()

    def judge_canaries() -> Awaitable[None]:
        return parts.rollout.judge_forever(settings.rollout.gate_check_interval_s)

    def watch_loop() -> Awaitable[None]:
        return measure_loop_lag_forever(parts.metrics.event_loop_lag)

    def run_batches() -> Awaitable[None]:
        return _batch_runner(parts).run_forever()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await parts.upstream.start()
        await _learn_the_fleet(parts)
        stalls = _watch_stalls(parts)
        stop_watching_gc = watch_gc_pauses(parts.metrics.gc_pause)
        crashed = parts.metrics.background_restarts.labels
        tasks = [
            asyncio.create_task(keep_running(name, loop, on_crash=lambda n: crashed(n).inc()))
            for name, loop in (
                ("health_probe", probe),
                ("prefix_expiry", expire),
                ("state_sync", parts.sync.follow),
                ("metrics_publish", publish_metrics),
                ("rollout_gate", judge_canaries),
                ("loop_lag", watch_loop),
                *((("batch_runner", run_batches),) if settings.batch.batch_max_active else ()),
            )
        ]
        try:
            yield
        finally:
            stop_watching_gc()
            await stalls.close()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await parts.pools.close()
            await parts.state.close()
            await parts.prefixes.close()
            await parts.upstream.close()

    return lifespan


def _probe_forever(parts: RouterParts) -> Awaitable[None]:
    health = parts.settings.health
    return probe_engines_forever(
        parts.registry,
        lambda: parts.upstream.session,
        interval_s=health.health_interval_s,
        timeout_s=health.health_timeout_s,
        failures_to_eject=health.health_failures_to_eject,
        clock=parts.clock,
        on_forgotten=parts.forget_worker,
        on_ejected=lambda worker: _fail_calls_to(parts, worker, "its health probes"),
    )


async def _learn_the_fleet(parts: RouterParts) -> None:
    """Read the shared state once before taking requests. A replica restarted under load
    otherwise answers its first requests before its follower's first read, with a 404
    for every model (its registry still empty). The backend's own timeouts bound this."""
    try:
        await parts.sync.resync()
    except StateUnavailable as error:
        log.warning("starting without the shared state (%s): workers appear as they report", error)


def _watch_stalls(parts: RouterParts) -> StallCheck:
    """Silent streams get their engine probed at once (``health.py``)."""
    health = parts.settings.health
    checked = parts.metrics.stall_checks.labels
    stalls = StallCheck(
        parts.registry,
        lambda: parts.upstream.session,
        engine_address,
        timeout_s=health.stall_check_timeout_s,
        failures=health.stall_check_failures,
        on_ejected=lambda worker: _fail_calls_to(parts, worker, "its stall probes"),
        on_checked=lambda hung: checked("hung" if hung else "alive").inc(),
    )
    parts.upstream.engines.watch_stalls(health.stall_check_after_s, stalls.suspect)
    return stalls


def _fail_calls_to(parts: RouterParts, worker: WorkerState, probes: str) -> int:
    reason = f"{worker.worker_id} failed {probes}"
    return parts.upstream.engines.fail_calls_to(worker.engine_url, reason)


async def _expire_forever(prefixes: PrefixTracker, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        prefixes.expire()


async def _api_error(_: Request, error: APIError) -> Response:
    return Response(
        content=error.json_bytes(),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers(),
    )


async def _routing_error(request: Request, error: HTTPException) -> Response:
    """Starlette's own refusals (no such path, a method the path lacks: the only two its
    router raises) in OpenAI's shape, not its ``{"detail": ...}``: one error body everywhere."""
    kind = {404: NotFound, 405: MethodNotAllowed}.get(error.status_code, InvalidRequest)
    answer = await _api_error(request, kind(f"{request.method} {request.url.path}: {error.detail}"))
    answer.headers.update(error.headers or {})  # 405's Allow
    return answer


async def _unexpected(request: Request, error: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return await _api_error(request, APIError("internal router error; see router log"))
