"""The router's own engine probes: trust, but verify the agents' heartbeats.

Two kinds. ``probe_engines_forever`` asks every engine's /health on a period, and a
worker leaves rotation only after several failures in a row: one slow answer from a busy
CPU engine is not a death. That vote takes ``health_failures_to_eject`` x (interval +
timeout), ~20 s with the defaults, and a hung engine's streams stall all that time.
``StallCheck`` is the fast path: a stream silent for ``stall_check_after_s`` makes the
router ask that engine's /health at once, with a short timeout. The silence and the
failed probes together are the evidence, so ``stall_check_failures`` short probes in a
row eject it. An engine that is only slow answers its /health (vLLM's API server
answers it without its engine core) and stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

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
            _record(registry, worker, healthy, failures_to_eject, on_ejected,
                    f"{failures_to_eject} health probes")  # fmt: skip
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


def _record(
    registry: WorkerRegistry,
    worker: WorkerState,
    healthy: bool,
    failures_to_eject: int,
    on_ejected: Callable[[WorkerState], int],
    failed_probes: str,
) -> None:
    if not registry.record_probe(worker.worker_id, healthy, failures_to_eject):
        return
    if healthy:
        log.warning("worker %s passed its health probe", worker.worker_id)
        return
    log.warning("worker %s failed %s in a row", worker.worker_id, failed_probes)
    if failed := on_ejected(worker):
        log.warning("%d calls in flight on %s failed over", failed, worker.worker_id)


@dataclass
class StallCheck:
    """Probes an engine at once when a stream on it goes silent; ejects it if it is hung.

    At most one check per engine runs at a time, so a hung engine's hundred silent streams
    cost one probe, not a hundred.
    """

    registry: WorkerRegistry
    session_factory: Callable[[], aiohttp.ClientSession]
    address_of: Callable[[str], tuple[str, int]]  # an engine URL's (host, port)
    timeout_s: float
    failures: int
    on_ejected: Callable[[WorkerState], int]
    on_checked: Callable[[bool], None] = lambda hung: None
    _running: dict[tuple[str, int], asyncio.Task[None]] = field(default_factory=dict)

    def suspect(self, address: tuple[str, int]) -> None:
        """A stream on the engine at ``address`` went silent."""
        if address in self._running:
            return
        worker = next(
            (w for w in self.registry.workers() if self.address_of(w.engine_url) == address
             and w.healthy),
            None,
        )  # fmt: skip
        if worker is None:  # not ours, or already out of rotation
            return
        task = asyncio.get_running_loop().create_task(self._check(worker))
        self._running[address] = task
        task.add_done_callback(lambda _: self._running.pop(address, None))

    async def _check(self, worker: WorkerState) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        for _ in range(self.failures):
            if await _healthy(self.session_factory(), worker.engine_url, timeout):
                self.on_checked(False)
                return
        self.on_checked(True)
        # Ejected now: the silence and these failures together are the evidence.
        _record(self.registry, worker, False, 1, self.on_ejected, f"{self.failures} stall probes")

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
