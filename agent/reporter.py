"""Register with the router and heartbeat load, over its admin API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import aiohttp

from agent import engine_memory
from agent.engine_load import parse_load
from contracts.workers import (
    HeartbeatReply,
    PullOrder,
    WorkerHeartbeat,
    WorkerLoad,
    WorkerRegistration,
    WorkerRole,
)

log = logging.getLogger("pdserve.agent")


class RouterReporter:
    """Keeps the router's view of one worker current.

    The router is the source of truth for routing, so every state change is
    pushed at once; the periodic heartbeat only refreshes load and liveness.
    A 404 on heartbeat means the router restarted and forgot us: re-register. A reply
    naming another role (the pool's P:D ratio changed) sets ``role_wanted``.

    ``ready_file`` (a Kubernetes readiness probe reads it) exists exactly while the
    router's last answer took this worker as ready: weights loaded, registered, and not
    draining. It goes at the first heartbeat that says otherwise, and on exit.
    """

    def __init__(
        self,
        *,
        router_url: str,
        agent_token: str,
        registration: WorkerRegistration,
        engine_url: str,
        interval_s: float = 2.0,
        timeout_s: float = 3.0,
        ready_file: Path | None = None,
        pulled_versions: Callable[[], tuple[str, ...]] = tuple,
        on_pull_order: Callable[[PullOrder], None] = lambda order: None,
    ) -> None:
        # Several router replicas, comma-separated: reports go to the last one that
        # answered; an unreachable one hands over to the next (they share state).
        self._router_urls = [u.strip().rstrip("/") for u in router_url.split(",") if u.strip()]
        self._current = 0
        self._headers = {"Authorization": f"Bearer {agent_token}"}
        self.registration = registration
        self._engine_url = engine_url
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._ready_file = ready_file
        self._pulled_versions = pulled_versions
        self._on_pull_order = on_pull_order
        self.ready = False
        self.draining = False
        self.wanted_role: WorkerRole | None = None
        self.role_wanted = asyncio.Event()

    async def __aenter__(self) -> RouterReporter:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._show_ready(False)
        if self._session:
            await self._session.close()

    async def set_ready(self, ready: bool, *, engine_pid: int | None, incarnation: int) -> None:
        self.ready = ready
        self.registration = self.registration.model_copy(
            update={"engine_pid": engine_pid, "incarnation": incarnation}
        )
        if ready:
            await self._post("/admin/workers/register", self.registration.model_dump(mode="json"))
        await self.beat()

    def become(self, registration: WorkerRegistration) -> None:
        """Report as this (re-roled) worker from now on; registered once its engine is ready."""
        self.registration = registration
        self.ready = self.draining = False
        self.wanted_role = None
        self.role_wanted.clear()

    async def set_draining(self) -> None:
        self.draining = True
        await self.beat()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.beat()

    async def beat(self) -> None:
        load = await self._scrape_load() if self.ready else WorkerLoad()
        if self.ready:
            memory = await asyncio.to_thread(engine_memory.measure, self.registration.engine_pid)
            load = load.model_copy(update=memory.as_load_fields())
        heartbeat = WorkerHeartbeat(
            worker_id=self.registration.worker_id,
            ready=self.ready and not self.draining,
            draining=self.draining,
            incarnation=self.registration.incarnation,
            load=load,
            pulled_versions=self._pulled_versions(),
        )
        status, reply = await self._exchange(
            "/admin/workers/heartbeat", heartbeat.model_dump(mode="json")
        )
        taken = status == 200 and self.ready and not self.draining
        if status == 404 and self.ready and not self.draining:
            registered = await self._post(
                "/admin/workers/register", self.registration.model_dump(mode="json")
            )
            taken = registered == 200
        self._show_ready(taken)
        if status == 200:
            self._heed(reply)

    def _show_ready(self, ready: bool) -> None:
        if self._ready_file is None:
            return
        if ready:
            self._ready_file.touch()
        else:
            self._ready_file.unlink(missing_ok=True)

    def _heed(self, reply: object) -> None:
        try:
            answer = HeartbeatReply.model_validate(reply)
        except ValueError:
            return  # an older router's reply: nothing asked of us
        if answer.pull is not None:
            self._on_pull_order(answer.pull)
        wanted = answer.role
        if wanted is not None and wanted is not self.registration.role:
            if self.wanted_role is None:
                log.info("the router asks this worker to serve %s", wanted.value)
            self.wanted_role = wanted
            self.role_wanted.set()

    async def _scrape_load(self) -> WorkerLoad:
        assert self._session is not None
        try:
            async with self._session.get(f"{self._engine_url}/metrics") as response:
                if response.status == 200:
                    return parse_load(await response.text())
                log.warning("engine /metrics answered %d: load unknown", response.status)
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            log.warning("engine /metrics unreadable (%s): load unknown", type(error).__name__)
        return WorkerLoad(known=False)

    async def _post(self, path: str, payload: dict) -> int | None:
        status, _ = await self._exchange(path, payload)
        return status

    async def _exchange(self, path: str, payload: dict) -> tuple[int | None, object]:
        for _ in self._router_urls:
            url = self._router_urls[self._current]
            answer = await self._exchange_with(url, path, payload)
            if answer is not None:
                return answer
            log.warning("router unreachable at %s", url)
            self._current = (self._current + 1) % len(self._router_urls)
        return None, None

    async def _exchange_with(self, url: str, path: str, payload: dict) -> tuple[int, object] | None:
        assert self._session is not None
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            async with self._session.post(
                url + path, json=payload, headers=self._headers
            ) as response:
                if response.status >= 400 and response.status != 404:
                    log.warning("router %s answered %d", path, response.status)
                reply = await response.json(content_type=None) if response.status == 200 else None
                return response.status, reply
        return None

    async def engine_idle(self) -> bool:
        load = await self._scrape_load()
        return load.known and load.num_requests_running + load.num_requests_waiting == 0
