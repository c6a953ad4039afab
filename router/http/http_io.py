"""HTTP plumbing the handlers share: capped JSON bodies, disconnects (typed parsing is
``errors.parsed``: the control plane validates with it too)."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from router.cancellation import unless
from router.errors import ClientDisconnected, InvalidRequest, RequestTooLarge

M = TypeVar("M", bound=BaseModel)


async def json_body(request: Request, max_bytes: int) -> Any:
    """The body parsed as JSON; 413 past ``max_bytes`` (declared or streamed), 400 if not JSON."""
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


async def unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """Run ``work``, cancelling it (and so its upstream calls) if the client leaves.

    Starlette only watches for disconnects while a response streams; before
    that, a departed client would otherwise keep a prefill running for nobody.
    """
    return await unless(
        work, _disconnected(request),
        lambda: ClientDisconnected("client disconnected before the answer", code="client_gone"),
    )  # fmt: skip


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def validated(model: type[M], body: Any) -> M:
    """``body`` as ``model``, or a 400 naming the first field that is wrong."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        raise InvalidRequest(first["msg"], param=".".join(map(str, first["loc"]))) from None
