"""The router's own engine probe: trust, but verify the agents' heartbeats."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from router.fleet.registry import WorkerRegistry, WorkerState

log = logging.getLogger("pdserve.router")


async def probe_engines_forever(
    registry: WorkerRegistry,
    session_factory: Callable[[], aiohttp.ClientSession],
    *,
    interval_s: float,
    timeout_s: float,
    failures_to_eject: int,
    clock: Callable[[], float],
    on_forgotten: Callable[[str], None] = lambda worker_id: None,
    on_ejected: Callable[[WorkerState], int] = lambda worker: 0,
) -> None:
    """Every ``interval_s``, GET each engine's /health and drop long-silent workers.

    One slow answer from a busy engine is not a death: a worker leaves rotation
    only after ``failures_to_eject`` probes in a row fail, and then ``on_ejected``
    fails the calls in flight on it and says how many (a hung engine's streams would
    otherwise wait out the stream idle timeout; failed, they migrate).
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    while True:
        session = session_factory()
        workers = registry.workers()
        results = await asyncio.gather(*(_healthy(session, w.engine_url, timeout) for w in workers))
        for worker, healthy in zip(workers, results, strict=True):
            if registry.record_probe(worker.worker_id, healthy, failures_to_eject):
                log.warning(
                    "worker %s %s", worker.worker_id,
                    "passed its health probe" if healthy else
                    f"failed {failures_to_eject} health probes in a row",
                )  # fmt: skip
                if not healthy and (failed := on_ejected(worker)):
                    log.warning("%d calls in flight on %s failed over", failed, worker.worker_id)
        for worker_id in registry.forget_silent(clock()):
            log.warning("worker %s forgotten after long silence", worker_id)
            on_forgotten(worker_id)
        await asyncio.sleep(interval_s)


async def _healthy(
    session: aiohttp.ClientSession, engine_url: str, timeout: aiohttp.ClientTimeout
) -> bool:
    try:
        async with session.get(f"{engine_url}/health", timeout=timeout) as response:
            return response.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False
