"""Every request gets an id: the client's ``X-Request-Id`` when it is a safe token, else a
fresh one. The id is answered in the same header (errors included), passed to both engines
(``upstream.py`` sends it, and vLLM then names its request after it), and logged on every
line about the request (``contracts.logs``).

A plain ASGI middleware rather than Starlette's ``BaseHTTPMiddleware``: that one runs
the app in another task and buffers, which costs CPU on every request and every stream.
"""

from __future__ import annotations

from contracts.asgi import ASGIApp, Message, Receive, Scope, Send
from contracts.logs import REQUEST_ID_HEADER, request_id_from, request_id_var

_HEADER = REQUEST_ID_HEADER.lower().encode()


class RequestIds:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == _HEADER), None)
        request_id = request_id_from(given.decode("latin-1") if given is not None else None)
        encoded = request_id.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (_HEADER, encoded)]
            await send(message)

        token = request_id_var.set(request_id)
        try:
            await self._app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)
