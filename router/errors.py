"""One error hierarchy for the router, rendered as OpenAI's error body in one place, and
``parsed``: a body validated into its model, or a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from contracts.errors import ErrorBody, ErrorDetail


class APIError(Exception):
    """An error the client sees. Subclasses fix the status and OpenAI ``type``."""

    status = 500
    type = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> ErrorBody:
        return ErrorBody(
            error=ErrorDetail(
                message=self.message, type=self.type, param=self.param, code=self.code
            )
        )

    def json_bytes(self) -> bytes:
        return self.body().model_dump_json().encode()

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else {}


class InvalidRequest(APIError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(APIError):
    status = 401
    type = "authentication_error"


class Forbidden(APIError):
    status = 403
    type = "permission_error"


class NotFound(APIError):
    """An unknown model, worker or other named resource."""

    status = 404
    type = "not_found_error"


class MethodNotAllowed(APIError):
    status = 405
    type = "invalid_request_error"


class Conflict(APIError):
    """The resource is not in a state that allows this (cancelling an ended batch)."""

    status = 409
    type = "invalid_request_error"


class RequestTooLarge(APIError):
    status = 413
    type = "invalid_request_error"


class ClientDisconnected(APIError):
    """The client left before the answer (nginx's 499); only metrics see it."""

    status = 499
    type = "client_disconnected"


class Overloaded(APIError):
    """429: always with Retry-After, and the reason (its code) in a header of its own."""

    status = 429
    type = "rate_limit_error"

    def headers(self) -> dict[str, str]:
        reason = {"x-pdserve-reject-reason": self.code} if self.code else {}
        return {"Retry-After": str(self.retry_after_s or 1), **reason}


class UpstreamFailed(APIError):
    """A worker failed and no retry was possible."""

    status = 502
    type = "upstream_error"


class ContinuationDiverged(UpstreamFailed):
    """A migrated stream's continuation is not the text the client already received."""

    def __init__(self) -> None:
        super().__init__(
            "the stream's engine failed and its continuation on another worker diverged "
            "from the text already sent",
            code="migration_diverged",
        )


class NoCapacity(APIError):
    status = 503
    type = "service_unavailable"


class UpstreamTimeout(APIError):
    status = 504
    type = "timeout_error"


class UpstreamRejected(APIError):
    """The engine refused the request itself (e.g. prompt too long): pass it on as is."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.raw = body
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:500].decode(errors="replace") or f"engine answered {status}"
        super().__init__(message, code=str(status))

    def json_bytes(self) -> bytes:
        try:
            parsed = json.loads(self.raw)
            if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
                return self.raw
        except ValueError:
            pass
        return super().json_bytes()


def sse_error_event(error: APIError) -> bytes:
    """The event sent when a stream fails after its first byte; the stream then closes."""
    return b"event: error\ndata: " + error.json_bytes() + b"\n\n"


M = TypeVar("M", bound=BaseModel)


def parsed(model: type[M], body: Any) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        where = f" at {field}" if field else ""
        raise InvalidRequest(
            f"invalid {model.__name__}{where}: {first['msg']}", param=field
        ) from None
