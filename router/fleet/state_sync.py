"""This replica's view of the workers, kept in step with the shared state.

Agents report to any one replica. That replica applies the registration or heartbeat
to its own registry at once (the request path never waits on the state backend) and
writes the worker's record to the state, with ``forget_after_s`` as its TTL. Every
replica (this one too) follows the state's announcements and applies each changed
record to its registry: a new registration or incarnation registers, a heartbeat
refreshes liveness and load, a record gone removes the worker. The ``control``
document carries which workers are held out of rotation and which are asked to switch
roles, so the reply to a heartbeat is the same whichever replica gets it.

How close replicas' views are: one announcement (a Redis PUBLISH, sub-millisecond on
a LAN) after each heartbeat. In-flight load is not shared request by request: each
replica adds its own in-flight count to the engine's running and waiting requests,
which every replica sees within one heartbeat interval.

When the backend is unreachable, the registry keeps serving on its last view, writes
are dropped with one log line per outage, and the follower resyncs in full on
reconnect.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from contracts.workers import WorkerHeartbeat, WorkerRegistration, WorkerRole
from router.fleet.registry import WorkerRegistry
from router.state.base import Change, ControlState, StateUnavailable

log = logging.getLogger("pdserve.router")

CONTROL_DOCUMENT = "control"


class StateSync:
    def __init__(
        self,
        state: ControlState,
        *,
        registry: WorkerRegistry,
        record_ttl_s: float,
        on_registered: Callable[[WorkerRegistration, bool], None],
        on_gone: Callable[[str], None],
        on_control: Callable[[dict[str, WorkerRole]], None],
        settled: Callable[[str, WorkerRole], bool],
        wanted: Callable[[], dict[str, WorkerRole]],
        on_document: Callable[[str | None], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = state
        self._registry = registry
        self._ttl_s = record_ttl_s
        self._on_registered = on_registered
        self._on_gone = on_gone
        self._on_control = on_control
        self._settled = settled
        self._wanted = wanted
        self._on_document = on_document
        self._clock = clock
        self._backend_down = False

    def __repr__(self) -> str:
        return f"StateSync({self._state!r})"

    # -- writes (the replica an agent or operator reached) ----------------------

    async def registered(self, registration: WorkerRegistration) -> None:
        await self._write(self._record(registration, None))
        if self._settled(registration.worker_id, registration.role):
            await self._share_control()

    async def heartbeat(self, beat: WorkerHeartbeat) -> None:
        worker = self._registry.get(beat.worker_id)
        if worker is not None:
            await self._write(self._record(worker.registration, beat))

    async def removed(self, worker_id: str) -> None:
        await self._guarded(self._state.remove_worker(worker_id))

    async def publish_control(self, wanted: dict[str, WorkerRole]) -> None:
        """Raise ``StateUnavailable`` when the backend is down: a control change that
        other replicas cannot see must be refused, not half applied."""
        await self._state.put_document(
            CONTROL_DOCUMENT,
            {"held": sorted(self._registry.held()),
             "wanted": {w: role.value for w, role in wanted.items()}},
        )  # fmt: skip

    # -- the follower (every replica) -------------------------------------------

    async def follow(self) -> None:
        """Apply every announced change; on a (re)subscription, re-read everything."""
        changes = await self._state.subscribe()
        await self.resync()
        async for change in changes:
            await self.apply(change)

    async def apply(self, change: Change) -> None:
        if change.kind == "worker":
            await self._apply_worker(change.key, await self._state.worker(change.key))
        elif change.kind == "config" and change.key == CONTROL_DOCUMENT:
            await self._apply_control()
        elif change.kind == "config" and self._on_document is not None:
            await self._on_document(change.key)  # the model registry, the routes
        elif change.kind == "resync":
            await self.resync()

    async def resync(self) -> None:
        """Re-read everything. A worker missing from the state is removed only if this
        replica has not heard of it lately either: a backend restarted empty (no
        persistence) must not empty every replica's pools; the next heartbeat rewrites
        its record."""
        records = await self._state.workers()
        now = self._clock()
        for worker in self._registry.workers():
            if worker.worker_id not in records and not self._registry.is_eligible(worker, now):
                await self._apply_worker(worker.worker_id, None)
        for worker_id, record in records.items():
            await self._apply_worker(worker_id, record)
        await self._apply_control()
        if self._on_document is not None:
            await self._on_document(None)

    async def _apply_worker(self, worker_id: str, record: dict[str, Any] | None) -> None:
        current = self._registry.get(worker_id)
        if record is None:
            if current is not None:
                self._registry.deregister(worker_id)
                self._on_gone(worker_id)
            return
        registration = WorkerRegistration.model_validate(record["registration"])
        now = self._clock()
        new_incarnation = current is None or (
            current.registration.incarnation != registration.incarnation
        )
        if new_incarnation or current is None or current.role is not registration.role:
            self._registry.register(registration, now)
            self._on_registered(registration, new_incarnation)
            if self._settled(worker_id, registration.role):
                await self._share_control()
        if record.get("heartbeat"):
            self._registry.heartbeat(WorkerHeartbeat.model_validate(record["heartbeat"]), now)

    async def _apply_control(self) -> None:
        document = await self._state.document(CONTROL_DOCUMENT)
        if document is None:
            return
        _, control = document
        self._registry.set_held(set(control.get("held", ())))
        self._on_control({w: WorkerRole(role) for w, role in control.get("wanted", {}).items()})

    # -- helpers ----------------------------------------------------------------

    async def _share_control(self) -> None:
        try:
            await self.publish_control(self._wanted())
        except StateUnavailable as error:
            log.warning("could not share a settled re-role: %s", error)

    def _record(
        self, registration: WorkerRegistration, beat: WorkerHeartbeat | None
    ) -> dict[str, Any]:
        return {
            "registration": registration.model_dump(mode="json"),
            "heartbeat": None if beat is None else beat.model_dump(mode="json"),
        }

    async def _write(self, record: dict[str, Any]) -> None:
        worker_id = record["registration"]["worker_id"]
        await self._guarded(self._state.put_worker(worker_id, record, ttl_s=self._ttl_s))

    @property
    def backend_up(self) -> bool:
        return not self._backend_down

    async def _guarded(self, write: Any) -> None:
        try:
            await write
        except StateUnavailable as error:
            if not self._backend_down:
                log.error("state backend down; serving on the last view: %s", error)
            self._backend_down = True
            return
        if self._backend_down:
            log.info("state backend back")
            self._backend_down = False
