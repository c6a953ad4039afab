"""A real local HTTP server answering ``POST /v1/completions`` (or a path) with a handler."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web


@contextlib.asynccontextmanager
async def completions_server(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    path: str = "/v1/completions",
) -> AsyncIterator[str]:
    """Serve ``handler`` on a free loopback port; yields the base URL, stops on exit."""
    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
