"""Who may call what: each route's access level, checked before its handler runs.

- ``public``: no credentials (health, metrics);
- ``client``: an API key from ``api_keys`` or a tenant's ``keys`` when any is set; the
  caller's tenant (``tenants.py``) is left on ``request.state.tenant``;
- ``viewer`` / ``operator`` / ``admin``: a scoped admin token (``admin_tokens``); each
  scope includes the ones before it. ``admin_token`` (what agents register with) is an
  admin-scoped token named ``agents``. No token configured at all: the admin API answers
  403. A missing or unknown token is 401; a known token without the scope is 403.
The caller's name (never the token) is left on ``request.state.actor`` for the audit log.
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

from router.errors import Forbidden, Unauthorized
from router.settings import SCOPES

if TYPE_CHECKING:
    from router.app import RouterParts


class Access(enum.Enum):
    PUBLIC = "public"
    CLIENT = "client"
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


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
    if not parts.admin_tokens:
        raise Forbidden("the admin API is disabled: set PDSERVE_ADMIN_TOKEN on the router")
    identity = None if token is None else _match(token, parts.admin_tokens)
    if identity is None:
        raise Unauthorized("missing or invalid admin token", code="invalid_admin_token")
    name, scope = identity
    if SCOPES.index(scope) < SCOPES.index(access.value):
        raise Forbidden(
            f"token {name!r} has scope {scope!r}; this needs {access.value!r}",
            code="insufficient_scope",
        )
    request.state.actor = name


_COMPONENTS = "#/components/schemas/{model}"


def openapi_extra(route: Route) -> dict[str, Any] | None:
    """The route's documented request body; nested models are in ``body_components``."""
    if route.body is None:
        return None
    schema = route.body.model_json_schema(ref_template=_COMPONENTS)
    schema.pop("$defs", None)
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}  # fmt: skip


def body_components(routes: tuple[Route, ...]) -> dict[str, Any]:
    """The models nested in the documented bodies, for /openapi.json's components."""
    components: dict[str, Any] = {}
    for route in routes:
        if route.body is not None:
            components.update(
                route.body.model_json_schema(ref_template=_COMPONENTS).get("$defs", {})
            )
    return components


def guarded(route: Route) -> Handler:
    """The route's handler behind its access check (FastAPI sees the handler's signature)."""

    @functools.wraps(route.handler)
    async def handle(request: Request, **params: Any) -> Any:
        authorize(request, route.access)
        return await route.handler(request, **params)

    return handle
