"""The SRE's P:D ratio, changed live, dropping nothing.

A change (``PUT /admin/v1/pools/{model}``) is validated whole, stored as the model's
targets, and run as an *operation* by the configured scaler (router/fleet/scalers.py).
Kubernetes scales the pools' Deployments; the local scaler converges in steps:
1. choose up to ``rerole_step_workers`` workers of the surplus role, least loaded first
   (this router's in-flight requests plus the engine's running ones), then the ones whose
   cache is least useful (fewest blocks in the prefix index);
2. hold them: no new work is routed there; in-flight streams finish;
3. tell each one its new role in the reply to its next heartbeat (agents pull: they need
   no inbound port, and a router replica needs no address book of agents); the agent
   drains, restarts its engine in that role and registers again;
4. when every worker of the step serves its new role, release it and recount.
Bounds: never below 1 prefill and 1 decode, never more workers than the model has, each
step waits at most ``rerole_timeout_s``. A second change for the same model supersedes
the first at its next step boundary: a worker mid-restart finishes its switch, and the
new operation counts from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from contracts.workers import WorkerRole
from router.errors import InvalidRequest
from router.fleet.circuit_breaker import CircuitState
from router.fleet.pool_operations import PD_ROLES, Operation
from router.fleet.registry import WorkerRegistry, WorkerState
from router.fleet.scalers import Scaler
from router.settings import ControlSettings
from router.state.base import AuditEntry, ControlState, PoolTargets, StateUnavailable

log = logging.getLogger("pdserve.router")

_OPERATION = "operation:"  # state document name prefix


class PoolController:
    def __init__(
        self,
        settings: ControlSettings,
        *,
        registry: WorkerRegistry,
        state: ControlState,
        publish: Callable[[dict[str, WorkerRole]], Awaitable[None]],
        scaler: Callable[[PoolController], Scaler],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._state = state
        self._publish = publish  # shares holds and wanted roles with the other replicas
        self.wall_clock = wall_clock
        # Workers asked to switch roles (the local scaler's), as every replica sees it.
        self.switching: dict[str, WorkerRole] = {}
        self._operations: dict[str, Operation] = {}
        self._running: dict[str, tuple[Operation, asyncio.Task[None]]] = {}
        self._scaler = scaler(self)

    def __repr__(self) -> str:
        return f"PoolController(running={sorted(self._running)}, switching={self.switching})"

    # -- reads ------------------------------------------------------------------

    def counts(self, model: str) -> dict[WorkerRole, int]:
        """Registered P/D workers of the model by the role they serve now."""
        counts = dict.fromkeys(PD_ROLES, 0)
        for w in self._registry.workers():
            if w.registration.model == model and w.role in counts:
                counts[w.role] += 1
        return counts

    def wanted_role(self, worker_id: str) -> WorkerRole | None:
        return self.switching.get(worker_id)

    def wanted(self) -> dict[str, WorkerRole]:
        return dict(self.switching)

    def adopt(self, wanted: dict[str, WorkerRole]) -> None:
        """The shared view of which workers switch roles (another replica changed it)."""
        self.switching.clear()
        self.switching.update(wanted)

    def settled(self, worker_id: str, role: WorkerRole) -> bool:
        """A worker registered in ``role``: if that was the role asked of it, its switch is
        over, whichever replica ran the operation (even one that died since): release it.
        True if anything changed."""
        if self.switching.get(worker_id) is not role:
            return False
        del self.switching[worker_id]
        self._registry.release(worker_id)
        return True

    async def operation(self, operation_id: str) -> dict[str, Any] | None:
        """An operation as this replica ran it, or as another replica last saved it."""
        local = self._operations.get(operation_id)
        if local is not None:
            return local.as_dict()
        stored = await self._state.document(_OPERATION + operation_id)
        return None if stored is None else stored[1]

    def worker_state(self, worker: WorkerState, now_s: float) -> str:
        """starting, ready, draining, re-roling, down, or its circuit (open, half-open), as
        the pools view shows it."""
        if worker.worker_id in self.switching:
            return "re-roling"
        if not worker.healthy:
            return "down"
        circuit = worker.breaker.state(now_s)
        if circuit is not CircuitState.CLOSED:
            return f"circuit {circuit.value}"
        if worker.draining or self._registry.is_held(worker.worker_id):
            return "draining"
        if not worker.ready:
            return "starting"
        return "ready" if self._registry.is_eligible(worker, now_s) else "down"

    # -- changes ----------------------------------------------------------------

    def validate(self, model: str, body: Any) -> PoolTargets:
        """The requested targets, or a 400 naming the field; nothing changes on refusal."""
        if model not in self._registry.models():
            raise InvalidRequest(f"model {model!r} has no workers here", param="model")
        if not isinstance(body, dict):
            raise InvalidRequest("body must be a JSON object: {prefill, decode} or {ratio}")
        total = sum(self.counts(model).values())
        if "ratio" in body:
            prefill, decode = _split_ratio(body["ratio"], total)
        else:
            prefill, decode = (_count(body, name) for name in ("prefill", "decode"))
        for name, value in (("prefill", prefill), ("decode", decode)):
            if value < 1:
                raise InvalidRequest(f"{name} must be at least 1", param=name)
        target = PoolTargets(prefill=prefill, decode=decode)
        refusal = self._scaler.refusal(model, target, self.counts(model))
        if refusal is not None:
            raise refusal
        return target

    async def change(self, model: str, target: PoolTargets, actor: str) -> Operation:
        operation = Operation(
            id=f"op-{uuid.uuid4().hex[:12]}", model=model, target=target, actor=actor,
            created_unix_s=self.wall_clock(),
        )  # fmt: skip
        previous = self._running.get(model)
        await self._state.set_targets(model, target)
        await self._keep(operation)
        await self._audit(operation, "pool_change", "accepted")
        task = asyncio.create_task(self._run(operation, previous))
        self._running[model] = (operation, task)
        return operation

    async def close(self) -> None:
        for _, task in list(self._running.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(
        self, operation: Operation, previous: tuple[Operation, asyncio.Task[None]] | None
    ) -> None:
        if previous is not None:
            previous[0].superseded = True
            with contextlib.suppress(asyncio.CancelledError):
                await previous[1]  # it stops at its next step boundary

        async def checkpoint() -> None:
            await self._publish(self.wanted())
            await self._save(operation)

        try:
            await self._scaler.converge(operation, checkpoint)
        except Exception as error:  # an operation must end with a status, never vanish
            log.exception("pool change %s failed", operation.id)
            operation.status, operation.detail = "failed", str(error)
        finally:
            operation.finished_unix_s = self.wall_clock()
            if self._running.get(operation.model, (None,))[0] is operation:
                del self._running[operation.model]
            await self._save(operation)
            await self._audit(operation, "pool_change", operation.status)

    async def _keep(self, operation: Operation) -> None:
        self._operations[operation.id] = operation
        await self._save(operation)
        while len(self._operations) > self._settings.max_operations_kept:
            oldest = next(iter(self._operations))
            del self._operations[oldest]
            with contextlib.suppress(StateUnavailable):
                await self._state.delete_document(_OPERATION + oldest)

    async def _save(self, operation: Operation) -> None:
        """Other replicas answer GET for it from the state; a lost save costs only that."""
        try:
            await self._state.put_document(_OPERATION + operation.id, operation.as_dict())
        except StateUnavailable as error:
            log.warning("operation %s not saved to the state: %s", operation.id, error)

    async def _audit(self, operation: Operation, action: str, outcome: str) -> None:
        try:
            await self._append_audit(operation, action, outcome)
        except StateUnavailable as error:
            log.error("audit of %s %s lost (state down): %s", operation.id, outcome, error)

    async def _append_audit(self, operation: Operation, action: str, outcome: str) -> None:
        await self._state.append_audit(
            AuditEntry(
                at_unix_s=self.wall_clock(), actor=operation.actor, action=action,
                target=operation.model, outcome=outcome,
                detail={"operation": operation.id, **operation.target.as_dict(),
                        "steps": len(operation.steps), "detail": operation.detail},
            )
        )  # fmt: skip


def _count(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequest(f"{name} must be an integer", param=name)
    return value


def _split_ratio(ratio: Any, total: int) -> tuple[int, int]:
    """``"3:1"`` over ``total`` workers, rounded to the nearest whole worker."""
    if not isinstance(ratio, str) or ratio.count(":") != 1:
        raise InvalidRequest('ratio must look like "3:1" (prefill:decode)', param="ratio")
    left, right = ratio.split(":")
    try:
        p, d = float(left), float(right)
    except ValueError:
        raise InvalidRequest('ratio must look like "3:1" (prefill:decode)', param="ratio") from None
    if p <= 0 or d <= 0:
        raise InvalidRequest("both sides of ratio must be positive", param="ratio")
    prefill = round(total * p / (p + d))
    return prefill, total - prefill
