"""The reference the router's CPU is measured against: a proxy that does nothing but
forward a POST to one engine and relay its answer, streamed or not.

Two of them, to tell the framework's cost from pdserve's:
- ``aiohttp``: aiohttp.web in front of one pooled aiohttp client session;
- ``fastapi``: FastAPI on uvicorn (uvloop, httptools: the router's server stack) in
  front of the same client session.

    python -m benchmarks.bare_proxy --kind aiohttp --port 9000 --engine http://127.0.0.1:8101
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import uvicorn
import uvloop
from aiohttp import web
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

_JSON = {"Content-Type": "application/json"}


def aiohttp_app(engine_url: str) -> web.Application:
    app = web.Application()

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        async with session.post(engine_url + request.path, data=await request.read(),
                                headers=_JSON) as upstream:  # fmt: skip
            if upstream.content_type != "text/event-stream":
                return web.Response(body=await upstream.read(), status=upstream.status,
                                    content_type=upstream.content_type)  # fmt: skip
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.router.add_post("/v1/completions", forward)
    app.router.add_post("/v1/chat/completions", forward)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def fastapi_app(engine_url: str) -> FastAPI:
    holder: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        holder["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        yield
        await holder["session"].close()

    app = FastAPI(lifespan=lifespan)

    async def forward(request: Request) -> Response:
        upstream = await holder["session"].post(
            engine_url + request.url.path, data=await request.body(), headers=_JSON
        )
        if upstream.content_type != "text/event-stream":
            async with upstream:
                return Response(await upstream.read(), status_code=upstream.status,
                                media_type=upstream.content_type)  # fmt: skip

        async def relay() -> AsyncIterator[bytes]:
            async with upstream:
                async for chunk in upstream.content.iter_any():
                    yield chunk

        return StreamingResponse(relay(), media_type="text/event-stream")

    app.add_api_route("/v1/completions", forward, methods=["POST"])
    app.add_api_route("/v1/chat/completions", forward, methods=["POST"])
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=("aiohttp", "fastapi"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", required=True)
    args = parser.parse_args()
    if args.kind == "aiohttp":
        uvloop.install()
        web.run_app(aiohttp_app(args.engine), host="127.0.0.1", port=args.port,
                    access_log=None, print=None)  # fmt: skip
    else:
        uvicorn.run(fastapi_app(args.engine), host="127.0.0.1", port=args.port, loop="uvloop",
                    http="httptools", access_log=False, log_level="warning")  # fmt: skip


if __name__ == "__main__":
    main()
