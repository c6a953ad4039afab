"""The SRE's admin API, ``/admin/v1``: pools and their P:D ratio, workers, the audit log.

Every change is validated whole before anything moves (a refusal leaves the old config
in force) and audited with the caller's token name. Reads need ``viewer``; changes need
``operator``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from contracts.plans import FleetPlan
from contracts.status import StatusSnapshot
from contracts.workers import WorkerRole
from router.errors import InvalidRequest, NoCapacity, NotFound
from router.fleet.pool_operations import PD_ROLES
from router.http.access import Access, Route, actor_of, parts_of
from router.http.http_io import json_body, validated
from router.observability.status import snapshot
from router.state.base import AuditEntry, StateUnavailable

log = logging.getLogger("pdserve.router")

_CHANGE_BODY_BYTES = 4096
_PLAN_BODY_BYTES = 4096
_PLAN = "plan:"  # state document name prefix


class PoolChange(BaseModel):
    """Either both counts, or a ratio spread over the model's P/D workers."""

    prefill: int | None = Field(None, ge=1, description="prefill workers wanted")
    decode: int | None = Field(None, ge=1, description="decode workers wanted")
    ratio: str | None = Field(None, examples=["3:1"], description="prefill:decode instead")


_AUDIT_LIMIT_MAX = 1000
STATUS_BATCHES = 100  # the status view counts the newest this many batches


async def read_status(request: Request) -> dict[str, Any]:
    parts = parts_of(request)
    batches = await parts.batch.book.count_by_status(newest=STATUS_BATCHES)
    plans: dict[str, FleetPlan] = {}
    with contextlib.suppress(StateUnavailable):  # the status stands without the plans
        plans = await _plans(request)
    update = {"batches": batches, "plans": plans}
    return snapshot(parts).model_copy(update=update).model_dump(mode="json")


async def _plans(request: Request) -> dict[str, FleetPlan]:
    parts = parts_of(request)
    plans = {}
    for model in parts.registry.models():
        stored = await parts.state.document(_PLAN + model)
        if stored is not None:
            plans[model] = FleetPlan.model_validate(stored[1])
    return plans


async def list_plans(request: Request) -> dict[str, Any]:
    try:
        plans = await _plans(request)
    except StateUnavailable as error:
        raise state_down(error) from None
    return {"plans": {model: plan.model_dump(mode="json") for model, plan in plans.items()}}


async def publish_plan(request: Request, model: str) -> dict[str, Any]:
    """The planner's latest plan for a model; a plan for another fleet than the last, or
    in another mode, is audited (the recommendation changed, or is now applied), a
    repeat is not."""
    parts = parts_of(request)
    plan = validated(FleetPlan, await json_body(request, _PLAN_BODY_BYTES))
    if model not in parts.registry.models():
        raise NotFound(f"no workers serve model {model!r}", param="model", code="model_not_found")
    try:
        stored = await parts.state.document(_PLAN + model)
        await parts.state.put_document(_PLAN + model, plan.model_dump(mode="json"))
    except StateUnavailable as error:
        raise state_down(error) from None
    before = FleetPlan.model_validate(stored[1]) if stored else None
    if before is None or (before.prefill, before.decode, before.mode) != (
        plan.prefill,
        plan.decode,
        plan.mode,
    ):
        await audit_change(request, f"plan:{plan.mode}", f"{model} {plan.prefill}P+{plan.decode}D")
    return {"model": model, "plan": plan.model_dump(mode="json")}


async def list_pools(request: Request) -> dict[str, Any]:
    parts = parts_of(request)
    now = parts.clock()
    try:
        targets = await parts.state.targets()
    except StateUnavailable:
        targets = {}  # the pools as this replica sees them; targets come back with the state
    models: dict[str, Any] = {}
    for model in parts.registry.models():
        counts = parts.pools.counts(model)
        target = targets.get(model)
        models[model] = {
            "counts": {role.value: counts[role] for role in PD_ROLES},
            "target": target.as_dict() if target else None,
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "role": w.role.value,
                    "state": parts.pools.worker_state(w, now),
                    "wanted_role": _value(parts.pools.wanted_role(w.worker_id)),
                    "inflight_requests": parts.load.of(w.worker_id).requests,
                    "reserved_kv_tokens": parts.load.of(w.worker_id).kv_tokens,
                    "engine_running": w.load.num_requests_running,
                    "engine_waiting": w.load.num_requests_waiting,
                    "kv_cache_usage_perc": w.load.kv_cache_usage_perc,
                }
                for w in parts.registry.workers()
                if w.registration.model == model
            ],
        }
    return {"models": models}


async def change_pool(request: Request, model: str) -> JSONResponse:
    parts = parts_of(request)
    body = await json_body(request, _CHANGE_BODY_BYTES)
    target = parts.pools.validate(model, body)
    try:
        operation = await parts.pools.change(model, target, actor_of(request))
    except StateUnavailable as error:
        raise state_down(error) from None
    log.info("pool change %s by %s: %s %s", operation.id, actor_of(request), model, target)
    return JSONResponse(
        {"operation": operation.id, "target": target.as_dict(),
         "status_url": f"/admin/v1/operations/{operation.id}"},
        status_code=202,
    )  # fmt: skip


async def get_operation(request: Request, operation_id: str) -> dict[str, Any]:
    try:
        operation = await parts_of(request).pools.operation(operation_id)
    except StateUnavailable as error:
        raise state_down(error) from None
    if operation is None:
        raise NotFound(f"no operation {operation_id!r}", code="operation_not_found")
    return operation


async def drain_worker(request: Request, worker_id: str) -> dict[str, Any]:
    _known(request, worker_id)
    await _set_held(request, worker_id, held=True)
    await audit_change(request, "drain", worker_id)
    return {"worker_id": worker_id, "held": True}


async def undrain_worker(request: Request, worker_id: str) -> dict[str, Any]:
    parts = parts_of(request)
    _known(request, worker_id)
    if parts.pools.wanted_role(worker_id) is not None:
        raise InvalidRequest(f"{worker_id} is being re-roled; wait for its operation")
    await _set_held(request, worker_id, held=False)
    await audit_change(request, "undrain", worker_id)
    return {"worker_id": worker_id, "held": False}


async def delete_worker(request: Request, worker_id: str) -> dict[str, Any]:
    parts = parts_of(request)
    _known(request, worker_id)
    parts.registry.deregister(worker_id)
    parts.forget_worker(worker_id)
    await parts.sync.removed(worker_id)
    await audit_change(request, "delete", worker_id)
    return {"deleted": worker_id}


async def read_audit(request: Request) -> dict[str, Any]:
    raw = request.query_params.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= _AUDIT_LIMIT_MAX:
        raise InvalidRequest(f"limit must be 1..{_AUDIT_LIMIT_MAX}", param="limit")
    try:
        entries = await parts_of(request).state.audit(limit=int(raw))
    except StateUnavailable as error:
        raise state_down(error) from None
    return {
        "entries": [
            {"at_unix_s": e.at_unix_s, "actor": e.actor, "action": e.action,
             "target": e.target, "outcome": e.outcome, "detail": e.detail}
            for e in entries
        ]
    }  # fmt: skip


async def _set_held(request: Request, worker_id: str, *, held: bool) -> None:
    """Hold or release, shared with every replica; refused whole if the state is down."""
    parts = parts_of(request)
    was_held = parts.registry.is_held(worker_id)
    (parts.registry.hold if held else parts.registry.release)(worker_id)
    try:
        await parts.sync.publish_control(parts.pools.wanted())
    except StateUnavailable as error:
        (parts.registry.hold if was_held else parts.registry.release)(worker_id)
        raise state_down(error) from None


def state_down(error: StateUnavailable) -> NoCapacity:
    return NoCapacity(
        f"the control-plane state is unreachable; nothing was changed ({error})",
        code="state_unavailable",
        retry_after_s=5,
    )


def _known(request: Request, worker_id: str) -> None:
    if parts_of(request).registry.get(worker_id) is None:
        raise NotFound(f"no worker {worker_id!r} is registered", code="worker_not_found")


def _value(role: WorkerRole | None) -> str | None:
    return None if role is None else role.value


async def audit_change(request: Request, action: str, target: str) -> None:
    """Record a person's change in the audit log (also batch_api's admin cancel)."""
    parts = parts_of(request)
    with contextlib.suppress(StateUnavailable):  # the change stands; its record is lost
        await parts.state.append_audit(
            AuditEntry(at_unix_s=parts.wall_clock(), actor=actor_of(request), action=action,
                       target=target, outcome="ok", detail={})
        )  # fmt: skip


async def scrape_targets(request: Request) -> list[dict[str, Any]]:
    """Prometheus HTTP service discovery: every registered worker's engine /metrics."""
    return [
        {
            "targets": [urlsplit(w.engine_url).netloc],
            "labels": {"worker": w.worker_id, "role": w.role.value, "model": w.registration.model},
        }
        for w in parts_of(request).registry.workers()
    ]


ROUTES: tuple[Route, ...] = (
    Route("GET", "/admin/v1/pools", list_pools, Access.VIEWER),
    Route("PUT", "/admin/v1/pools/{model}", change_pool, Access.OPERATOR, body=PoolChange),
    Route("GET", "/admin/v1/operations/{operation_id}", get_operation, Access.VIEWER),
    Route("POST", "/admin/v1/workers/{worker_id}/drain", drain_worker, Access.OPERATOR),
    Route("POST", "/admin/v1/workers/{worker_id}/undrain", undrain_worker, Access.OPERATOR),
    Route("DELETE", "/admin/v1/workers/{worker_id}", delete_worker, Access.OPERATOR),
    Route("GET", "/admin/v1/audit", read_audit, Access.VIEWER),
    Route("GET", "/admin/v1/plans", list_plans, Access.VIEWER),
    Route("PUT", "/admin/v1/plans/{model}", publish_plan, Access.PLAN, body=FleetPlan),
    Route("GET", "/admin/v1/status", read_status, Access.VIEWER, answer=StatusSnapshot),
    Route("GET", "/admin/v1/scrape_targets", scrape_targets, Access.VIEWER),
)
