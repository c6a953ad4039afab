"""The admin API for versions in production: the model registry, routes and their stages,
promotion and rollback, reviewers' approvals and the review queue.

Reads need ``viewer``; registering and routing need ``operator``; approving a version and
the review queue need ``reviewer`` (``settings.SCOPE_GRANTS``). A model's policy may be
written by an operator or a reviewer, and only a reviewer may loosen it. A bad change is
a 400 naming the field, and the old registry, route or policy stays in force.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from contracts.rollout import Approval, ModelArtifact, ModelPolicy, RouteSpec
from router.errors import InvalidRequest, NotFound, parsed
from router.http.access import Access, Route, actor_of, may, parts_of
from router.http.admin_api import state_down
from router.http.http_io import json_body
from router.rollout.prepull import gate_open, pulled_count
from router.rollout.rollout import PolicyState, RouteState
from router.rollout.shadow import summary
from router.state.base import StateUnavailable

_BODY_BYTES = 256 * 1024  # a route's safety policy can carry a blocklist
_REVIEW_LIMIT_MAX = 1000
T = TypeVar("T")


class ReviewMark(BaseModel):
    mark: str = Field(min_length=1, max_length=200, examples=["harmful", "false_positive"])


async def _guarded(change: Awaitable[T]) -> T:
    try:
        return await change
    except StateUnavailable as error:
        raise state_down(error) from None


# -- the registry ---------------------------------------------------------------------


async def register_model(request: Request) -> JSONResponse:
    parts = parts_of(request)
    artifact = parsed(ModelArtifact, await json_body(request, _BODY_BYTES))
    await _guarded(parts.rollout.register(artifact, actor_of(request)))
    record = parts.rollout.rollout.artifact(artifact.model_id, artifact.version)
    return JSONResponse(record.model_dump() if record else {}, status_code=201)


async def list_models(request: Request) -> dict[str, Any]:
    parts = parts_of(request)
    now = parts.clock()
    serving: dict[tuple[str, str | None], int] = {}
    for worker in parts.registry.workers():
        if parts.registry.is_eligible(worker, now):
            key = (worker.registration.model, worker.registration.model_version)
            serving[key] = serving.get(key, 0) + 1
    stages = {
        (model_id, version): stage
        for model_id, route in parts.rollout.rollout.routes().items()
        for stage, version in route.spec.versions().items()
    }
    return {
        "models": [
            {**artifact.model_dump(),
             "stage": stages.get((artifact.model_id, artifact.version)),
             "ready_workers": serving.get((artifact.model_id, artifact.version), 0)}
            for artifact in parts.rollout.rollout.artifacts()
        ]
    }  # fmt: skip


# -- routes ---------------------------------------------------------------------------


async def list_routes(request: Request) -> dict[str, Any]:
    parts = parts_of(request)
    return {
        "routes": {m: _route_view(request, m, r) for m, r in parts.rollout.rollout.routes().items()}
    }


async def get_route(request: Request, model_id: str) -> dict[str, Any]:
    route = parts_of(request).rollout.rollout.route(model_id)
    if route is None:
        raise NotFound(f"{model_id} has no route", param="model_id", code="route_not_found")
    return _route_view(request, model_id, route)


async def put_route(request: Request, model_id: str) -> dict[str, Any]:
    parts = parts_of(request)
    body = await json_body(request, _BODY_BYTES)
    await _guarded(parts.rollout.set_route(model_id, body, actor_of(request)))
    return await get_route(request, model_id)


async def delete_route(request: Request, model_id: str) -> dict[str, Any]:
    parts = parts_of(request)
    versions = frozenset(w.registration.model_version for w in parts.registry.workers()
                         if w.registration.model == model_id)  # fmt: skip
    await _guarded(parts.rollout.delete_route(model_id, actor_of(request), versions))
    return {"deleted": model_id}


async def promote(request: Request, model_id: str) -> dict[str, Any]:
    spec, verdict = await _guarded(parts_of(request).rollout.promote(model_id, actor_of(request)))
    return {"model_id": model_id, "prod": spec.prod, "gate": verdict.as_dict()}


async def rollback(request: Request, model_id: str) -> dict[str, Any]:
    spec = await _guarded(parts_of(request).rollout.rollback(model_id, actor_of(request)))
    return {"model_id": model_id, "prod": spec.prod, "canary": None}


async def approve(request: Request, model_id: str) -> dict[str, Any]:
    approval = parsed(Approval, await json_body(request, 8192))
    await _guarded(parts_of(request).rollout.approve(model_id, approval, actor_of(request)))
    return await get_policy(request, model_id)


# -- policies -------------------------------------------------------------------------


async def get_policy(request: Request, model_id: str) -> dict[str, Any]:
    """The model's policy and approvals (the default policy when none was set)."""
    return _policy_view(request, model_id, parts_of(request).rollout.rollout.policy(model_id))


async def list_policies(request: Request) -> dict[str, Any]:
    policies = parts_of(request).rollout.rollout.policies()
    return {"policies": {m: _policy_view(request, m, p) for m, p in policies.items()}}


async def put_policy(request: Request, model_id: str) -> dict[str, Any]:
    body = await json_body(request, _BODY_BYTES)
    control = parts_of(request).rollout
    change = control.set_policy(model_id, body, actor_of(request),
                                may_loosen=may(request, Access.REVIEWER))  # fmt: skip
    await _guarded(change)
    return await get_policy(request, model_id)


def _policy_view(request: Request, model_id: str, state: PolicyState) -> dict[str, Any]:
    """The policy, and the stages its route now serves from versions no reviewer approved
    (a policy tightened under a live route): the operator's next route change fixes them."""
    view = {"model_id": model_id, **state.as_dict()}
    route = parts_of(request).rollout.rollout.route(model_id)
    if route is not None:
        unapproved = parts_of(request).rollout.rollout.unapproved_stages(model_id, route.spec)
        view["unapproved_serving"] = [stage for stage, _ in unapproved]
    return view


async def shadow_records(request: Request, model_id: str) -> dict[str, Any]:
    mirror = parts_of(request).rollout_path.shadow
    records = [r for r in mirror.records if r.model == model_id]
    return {"summary": summary(records), "records": [dataclasses.asdict(r) for r in records]}


def _route_view(request: Request, model_id: str, route: RouteState) -> dict[str, Any]:
    control = parts_of(request).rollout
    view = route.as_dict()
    canary = route.spec.canary
    if canary is not None:
        view["gate_verdict"] = control.verdict(model_id).as_dict()
    if canary is not None and canary.prepull_workers:
        workers = parts_of(request).registry.workers()
        view["prepull"] = {
            "version": canary.version, "workers": canary.prepull_workers,
            "pulled": pulled_count(model_id, canary.version, workers),
            "open": gate_open(route.spec, model_id, lambda: workers),
        }  # fmt: skip
    return {"model_id": model_id, **view}


# -- the review queue -----------------------------------------------------------------


async def list_review(request: Request) -> dict[str, Any]:
    raw = request.query_params.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= _REVIEW_LIMIT_MAX:
        raise InvalidRequest(f"limit must be 1..{_REVIEW_LIMIT_MAX}", param="limit")
    items = await _guarded(parts_of(request).review.items(limit=int(raw)))
    return {"items": items}


async def mark_review(request: Request, item_id: str) -> dict[str, Any]:
    mark = parsed(ReviewMark, await json_body(request, 4096))
    item = await _guarded(parts_of(request).review.mark(item_id, mark.mark, actor_of(request)))
    if item is None:
        raise NotFound(f"no review item {item_id!r}", code="review_item_not_found")
    return item


_ROUTE = "/admin/v1/routes/{model_id}"
_POLICY = "/admin/v1/policies/{model_id}"
ROUTES: tuple[Route, ...] = (
    Route("POST", "/admin/v1/models", register_model, Access.OPERATOR, body=ModelArtifact),
    Route("GET", "/admin/v1/models", list_models, Access.VIEWER),
    Route("GET", "/admin/v1/routes", list_routes, Access.VIEWER),
    Route("GET", _ROUTE, get_route, Access.VIEWER),
    Route("PUT", _ROUTE, put_route, Access.OPERATOR, body=RouteSpec),
    Route("DELETE", _ROUTE, delete_route, Access.OPERATOR),
    Route("POST", f"{_ROUTE}/promote", promote, Access.OPERATOR),
    Route("POST", f"{_ROUTE}/rollback", rollback, Access.OPERATOR),
    Route("POST", f"{_ROUTE}/approve", approve, Access.REVIEWER, body=Approval),
    Route("GET", "/admin/v1/policies", list_policies, Access.VIEWER),
    Route("GET", _POLICY, get_policy, Access.VIEWER),
    Route("PUT", _POLICY, put_policy, Access.POLICY, body=ModelPolicy),
    Route("GET", f"{_ROUTE}/shadow", shadow_records, Access.VIEWER),
    Route("GET", "/admin/v1/review", list_review, Access.REVIEWER),
    Route("POST", "/admin/v1/review/{item_id}", mark_review, Access.REVIEWER, body=ReviewMark),
)
