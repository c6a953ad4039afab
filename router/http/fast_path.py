"""The hot routes served straight from ASGI, past Starlette's router and FastAPI's request
machinery (exception and exit-stack middleware, route matching, dependency solving),
which cost about a fifth of the router's CPU per request in the profile
(``benchmarks/results/router_cpu.md``).

It is the same route table entry (``Route(..., hot=True)``), the same access check, the
same handler and the same error shape; every other request goes on to the FastAPI app.
It sits inside the app as middleware, so Starlette has set ``scope["app"]`` (handlers
find the router's parts there) and ``RequestIds`` has named the request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response

from contracts.asgi import ASGIApp, Receive, Scope, Send
from router.errors import APIError
from router.http.access import Route, authorize

log = logging.getLogger("pdserve.router")

ErrorAnswer = Callable[[Request, Exception], Awaitable[Response]]


class HotRoutes:
    def __init__(
        self,
        app: ASGIApp,
        *,
        routes: tuple[Route, ...],
        api_error: ErrorAnswer,
        unexpected: ErrorAnswer,
    ) -> None:
        self._app = app
        self._routes = {(r.method, r.path): r for r in routes if r.hot}
        self._api_error = api_error
        self._unexpected = unexpected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self._routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        )
        if route is None:
            await self._app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            authorize(request, route.access)
            response = await route.handler(request)
        except APIError as error:
            response = await self._api_error(request, error)
        except Exception as error:  # the same last resort as the app's handler
            response = await self._unexpected(request, error)
        await response(scope, receive, send)
