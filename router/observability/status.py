"""``GET /admin/v1/status``: the snapshot ``pdserve status`` draws (``contracts.status``).

Read-only and built from what the router already holds: the registry, its in-flight
load, admission's queues, the recent TTFT samples and the windowed token and cost sums.
"""

from __future__ import annotations

from contracts.status import ModelStatus, StatusSnapshot, WorkerStatus
from contracts.workers import WorkerRole
from router.fleet.registry import WorkerState
from router.observability.metric_views import window_view
from router.parts import RouterParts


def snapshot(parts: RouterParts) -> StatusSnapshot:
    now = parts.clock()
    view = window_view(parts.metrics.families())
    models = [_model_status(parts, model, now, view) for model in sorted(parts.registry.models())]
    return StatusSnapshot(
        window_s=parts.metrics.tokens_window.window_s,
        taken_at_unix_s=parts.wall_clock(),
        models=models,
    )


def _model_status(
    parts: RouterParts, model: str, now: float, view: dict[str, dict[tuple[str, ...], float]]
) -> ModelStatus:
    metrics = parts.metrics
    workers = sorted(
        (w for w in parts.registry.workers() if w.registration.model == model),
        key=lambda w: (w.role.value, w.worker_id),
    )
    by_role = {role.value: sum(1 for w in workers if w.role is role) for role in WorkerRole}
    ttft = metrics.recent_ttft.quantiles(model, (0.5, 0.99))
    rates = view.get("pdserve_tokens_per_second", {})
    prices = view.get("pdserve_cost_usd_per_million_tokens", {})
    queue = parts.admission.queues().get(model)
    embedding = metrics.recent_embedding_latency.quantiles(model, (0.5, 0.99))
    return ModelStatus(
        model=model,
        workers_by_role={role: count for role, count in by_role.items() if count},
        queue_waiting_requests=queue.waiting if queue is not None else 0,
        queued_prefill_tokens=sum(parts.load.of(w.worker_id).tokens for w in workers),
        ttft_p50_s=ttft[0] if ttft else None,
        ttft_p99_s=ttft[1] if ttft else None,
        ttft_samples=metrics.recent_ttft.count(model),
        input_tokens_per_s=rates.get((model, "input"), 0.0),
        output_tokens_per_s=rates.get((model, "output"), 0.0),
        usd_per_million_input_tokens=prices.get((model, "all", "input")),
        usd_per_million_output_tokens=prices.get((model, "all", "output")),
        workers=[_worker_status(parts, w, now) for w in workers],
        route=_route(parts, model),
        degraded=_degraded(parts, model, now),
        embedding_latency_p50_s=embedding[0] if embedding else None,
        embedding_latency_p99_s=embedding[1] if embedding else None,
        embedding_samples=metrics.recent_embedding_latency.count(model),
    )


def _degraded(parts: RouterParts, model: str, now: float) -> str | None:
    left = parts.registry.pools(model, now).degraded
    return None if left is None else left.value


def _route(parts: RouterParts, model: str) -> str | None:
    route = parts.rollout.rollout.route(model)
    if route is None:
        return None
    spec, stages = route.spec, [f"prod {route.spec.prod}"]
    if spec.canary is not None:
        stages.append(f"canary {spec.canary.version} {spec.canary.weight:.0%}")
    if spec.shadow is not None:
        stages.append(f"shadow {spec.shadow.version} {spec.shadow.sample_rate:.0%}")
    return " · ".join(stages)


def _worker_status(parts: RouterParts, worker: WorkerState, now: float) -> WorkerStatus:
    inflight = parts.load.of(worker.worker_id)
    return WorkerStatus(
        worker_id=worker.worker_id,
        role=worker.role.value,
        state=parts.pools.worker_state(worker, now),
        kind=worker.registration.accelerator,
        inflight_requests=inflight.requests,
        engine_running=worker.load.num_requests_running,
        engine_waiting=worker.load.num_requests_waiting,
        kv_cache_usage_perc=worker.load.kv_cache_usage_perc,
        engine_memory_bytes=worker.load.engine_memory_bytes,
        version=worker.registration.model_version,
    )
