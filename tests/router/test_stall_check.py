"""The fast hang check: a silent stream's engine is probed at once, against real HTTP
engines, one hung (its /health never answers) and one only slow (it answers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from contracts.workers import WorkerRegistration, WorkerRole
from localrun.ports import free_ports
from router.fleet.health import StallCheck
from router.fleet.registry import WorkerRegistry
from router.orchestration.engine_client import engine_address
from tests.conditions import until


@contextlib.asynccontextmanager
async def engines(hung: asyncio.Event) -> AsyncIterator[dict[str, str]]:
    """Two engines on free ports: ``alive`` answers /health, ``hung`` waits until ``hung``
    is set (SIGSTOP's look from outside: the connection opens, nothing comes back)."""

    async def answer(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def never(_: web.Request) -> web.Response:
        await hung.wait()
        return web.Response(text="")

    runners, urls = [], {}
    for name, health, port in zip(("alive", "hung"), (answer, never), free_ports(2), strict=True):
        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        yield urls
    finally:
        hung.set()
        for runner in runners:
            await runner.cleanup()


async def test_a_hung_engine_is_ejected_and_its_calls_failed_and_a_slow_one_stays():
    registry = WorkerRegistry(heartbeat_timeout_s=10, forget_after_s=60, max_workers=8)
    ejected: list[str] = []
    outcomes: list[bool] = []
    released = asyncio.Event()
    async with engines(released) as urls, aiohttp.ClientSession() as session:
        for name, url in urls.items():
            registry.register(
                WorkerRegistration(worker_id=name, role=WorkerRole.DECODE, model="m",
                                   engine_url=url, incarnation=1), now_s=0,
            )  # fmt: skip
        check = StallCheck(
            registry, lambda: session, engine_address, timeout_s=0.3, failures=2,
            on_ejected=lambda worker: ejected.append(worker.worker_id) or 1,
            on_checked=outcomes.append,
        )  # fmt: skip
        for _ in range(5):  # a hundred silent streams on one engine: one check at a time
            check.suspect(engine_address(urls["hung"]))
        check.suspect(engine_address(urls["alive"]))
        check.suspect(("127.0.0.1", 1))  # no worker of ours: nothing to do
        await until(lambda: len(outcomes) == 2, 5, "both checks to end")
        assert sorted(outcomes) == [False, True] and ejected == ["hung"]
        eligible = [w.worker_id for w in registry.eligible("m", WorkerRole.DECODE, 0)]
        assert eligible == ["alive"]
        check.suspect(engine_address(urls["hung"]))  # out of rotation: not probed again
        await check.close()
        assert len(outcomes) == 2
