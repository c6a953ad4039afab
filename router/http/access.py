"""Who may call what: each route's access level, checked before its handler runs.

- ``public``: no credentials (health, metrics);
- ``client``: an API key from ``api_keys`` or a tenant's ``keys`` when any is set; the
  caller's tenant (``tenants.py``) is left on ``request.state.tenant``;
- ``viewer`` / ``operator`` / ``reviewer`` / ``admin``: a person's scoped token
  (``admin_tokens``); what each scope grants is ``settings.SCOPE_GRANTS`` (admin does
  not include reviewer). ``admin_token`` is an admin-scoped token named ``admin``.
  ``policy`` (writing a model's policy) is granted to operators and reviewers alike;
- ``agent``: a worker's own token, minted from ``agent_secret``
  (``contracts.agent_tokens``); the caller is named ``agent:<worker id>``, and the
  handler holds it to that worker (``agent_worker``).
No token configured at all: the admin API answers 403. A missing or unknown token is
401; a known token without the scope is 403. The caller's name (never the token) is left
on ``request.state.actor`` for the audit log, its scope on ``request.state.scope``.
"""

from __future__ import annotations

import enum
import functools
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from pydantic import BaseModel

from contracts.agent_tokens import verified_worker
from router.errors import Forbidden, Unauthorized
from router.http.answer_schemas import ErrorResponse
from router.settings import SCOPE_GRANTS

if TYPE_CHECKING:
    from router.parts import RouterParts


class Access(enum.Enum):
    PUBLIC = "public"
    CLIENT = "client"
    VIEWER = "viewer"
    OPERATOR = "operator"
    REVIEWER = "reviewer"
    POLICY = "policy"
    PLAN = "plan"
    ADMIN = "admin"
    AGENT = "agent"


Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    access: Access
    # Documents the JSON body in /openapi.json; the handler still validates it itself,
    # so that a bad field is a 400 naming it in OpenAI's error shape, never FastAPI's 422.
    body: type[BaseModel] | None = None
    # Documents the 200 answer, and (streamed generation) the SSE event each chunk carries.
    answer: type[BaseModel] | None = None
    stream_chunk: type[BaseModel] | None = None
    # Served by ``fast_path.HotRoutes`` straight from ASGI (no path parameters).
    hot: bool = False


def parts_of(request: Request) -> RouterParts:
    return request.app.state.parts


def actor_of(request: Request) -> str:
    return getattr(request.state, "actor", "anonymous")


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def _match(token: str, accepted: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """Constant-time comparison against every accepted token."""
    found = None
    for candidate, identity in accepted.items():
        if hmac.compare_digest(token.encode(), candidate.encode()):
            found = identity
    return found


def authorize(request: Request, access: Access) -> None:
    parts = parts_of(request)
    if access is Access.PUBLIC:
        return
    token = _bearer(request)
    if access is Access.CLIENT:
        keys = {*parts.settings.server.api_keys, *parts.tenants.keys()}
        if keys and (token is None or _match(token, {k: ("client", "") for k in keys}) is None):
            raise Unauthorized("missing or invalid API key", code="invalid_api_key")
        request.state.tenant = parts.tenants.identify(token if keys else None)
        return
    secret = parts.settings.server.agent_secret
    if not parts.admin_tokens and not secret:
        raise Forbidden("the admin API is disabled: set PDSERVE_ADMIN_TOKEN on the router")
    identity = None if token is None else _identify(token, parts.admin_tokens, secret)
    if identity is None:
        raise Unauthorized("missing or invalid admin token", code="invalid_admin_token")
    name, scope = identity
    if access.value not in SCOPE_GRANTS[scope]:
        raise Forbidden(
            f"token {name!r} has scope {scope!r}; this needs {access.value!r}",
            code="insufficient_scope",
        )
    request.state.actor = name
    request.state.scope = scope


def _identify(
    token: str, people: dict[str, tuple[str, str]], agent_secret: str | None
) -> tuple[str, str] | None:
    """(name, scope) of a person's token, or of an agent's (named ``agent:<worker id>``)."""
    if agent_secret:
        worker = verified_worker(agent_secret, token)
        if worker is not None:
            return f"agent:{worker}", "agent"
    return _match(token, people)


def authorized(request: Request, access: Access) -> bool:
    """Whether the caller's credentials pass ``access`` (no error for a caller without)."""
    try:
        authorize(request, access)
    except (Unauthorized, Forbidden):
        return False
    return True


def schema_for_clients(spec: dict[str, Any], routes: tuple[Route, ...]) -> dict[str, Any]:
    """``spec`` with only the public and client routes, and the components they name: what
    an anonymous caller sees of /openapi.json (the admin API is a viewer's to read)."""
    open_paths = {r.path for r in routes if r.access in (Access.PUBLIC, Access.CLIENT)}
    paths = {path: ops for path, ops in spec.get("paths", {}).items() if path in open_paths}
    schemas = spec.get("components", {}).get("schemas", {})
    named: set[str] = set()
    pending = [paths]
    while pending:  # every component a kept path names, and those they name in turn
        for ref in _refs(pending.pop()):
            if ref not in named and ref in schemas:
                named.add(ref)
                pending.append(schemas[ref])
    components = {"schemas": {name: schemas[name] for name in sorted(named)}}
    return {**spec, "paths": paths, "components": components}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"].rsplit("/", 1)[-1]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def may(request: Request, access: Access) -> bool:
    """Whether the (authorized) caller's scope also grants ``access``."""
    scope = getattr(request.state, "scope", None)
    return scope is not None and access.value in SCOPE_GRANTS[scope]


def agent_worker(request: Request) -> str | None:
    """The worker id an agent's token names (None for a person's token)."""
    if getattr(request.state, "scope", None) != "agent":
        return None
    return actor_of(request).removeprefix("agent:")


_COMPONENTS = "#/components/schemas/{model}"
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}
# The errors each access level can answer, besides the route's own.
_ERRORS: dict[Access, dict[int, str]] = {
    Access.PUBLIC: {},
    Access.CLIENT: {
        400: "invalid request: a bad field (named in `param`), context length, a size limit",
        401: "missing or invalid API key",
        404: "unknown model",
        413: "request body too large",
        429: "overloaded: admission, a rate limit, or a full queue (Retry-After)",
        499: "the client went away",
        502: "a worker failed and no retry was left",
        503: "no ready worker for the model (Retry-After)",
    },
}
_ADMIN_ERRORS = {400: "invalid change, nothing applied", 401: "missing or invalid token",
                 403: "the token lacks the scope, or the admin API is off",
                 404: "not found", 503: "the state backend is down (Retry-After)"}  # fmt: skip


def openapi_extra(route: Route) -> dict[str, Any]:
    """The route's documented request body, answer and errors; nested models are in
    ``body_components``."""
    extra: dict[str, Any] = {"responses": _responses(route)}
    if route.body is not None:
        schema = route.body.model_json_schema(ref_template=_COMPONENTS)
        schema.pop("$defs", None)
        extra["requestBody"] = {"required": True,
                                "content": {"application/json": {"schema": schema}}}  # fmt: skip
    return extra


def _responses(route: Route) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK"}
    content: dict[str, Any] = {}
    if route.answer is not None:
        content["application/json"] = {"schema": _ref(route.answer)}
    if route.stream_chunk is not None:
        content["text/event-stream"] = {"schema": {
            "type": "string",
            "description": f"with `stream: true`: `data: <{route.stream_chunk.__name__}>` "
                           "events, then `data: [DONE]`; a failure after the first byte is "
                           "an `event: error` with the error shape",
        }}  # fmt: skip
    if content:
        ok["content"] = content
    responses: dict[str, Any] = {"200": ok}
    errors = _ERRORS.get(route.access, _ADMIN_ERRORS)
    for status, description in errors.items():
        answer: dict[str, Any] = {
            "description": description,
            "content": {"application/json": {"schema": _ref(ErrorResponse)}},
        }
        if status in (429, 503):
            answer["headers"] = _RETRY_AFTER
        responses[str(status)] = answer
    return responses


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _COMPONENTS.format(model=model.__name__)}


def body_components(routes: tuple[Route, ...]) -> dict[str, Any]:
    """Every model the documented bodies and answers name, for /openapi.json's components."""
    components: dict[str, Any] = {}
    models = {ErrorResponse}
    for route in routes:
        models.update(m for m in (route.body, route.answer, route.stream_chunk) if m)
    for model in models:
        schema = model.model_json_schema(ref_template=_COMPONENTS)
        components.update(schema.pop("$defs", {}))
        if model not in {route.body for route in routes}:
            components[model.__name__] = schema
    return components


def guarded(route: Route) -> Handler:
    """The route's handler behind its access check (FastAPI sees the handler's signature)."""

    @functools.wraps(route.handler)
    async def handle(request: Request, **params: Any) -> Any:
        authorize(request, route.access)
        return await route.handler(request, **params)

    return handle
