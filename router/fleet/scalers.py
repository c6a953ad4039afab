"""How the ratio API's targets become pools: a ``Scaler``.

``LocalReroling`` (the default) moves the workers a model has between its pools: the
total stays, each worker drains and restarts its engine in the other role.
``KubernetesScaler`` (router/fleet/kubernetes_scaler.py) sets the replicas of the pools'
Deployments instead, within configured bounds, and Kubernetes starts and stops pods.
Either way the operation ends when the registered workers match the target.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Literal, Protocol

from contracts.workers import WorkerRole
from router.errors import InvalidRequest
from router.fleet.pool_operations import PD_ROLES, Checkpoint, Operation, Step
from router.fleet.registry import WorkerRegistry, WorkerState
from router.scheduling.load import InFlightLoad
from router.settings import ControlSettings
from router.state.base import PoolTargets

log = logging.getLogger("pdserve.router")


class Scaler(Protocol):
    def refusal(
        self, model: str, target: PoolTargets, counts: Mapping[WorkerRole, int]
    ) -> InvalidRequest | None:
        """Why ``target`` cannot be reached from ``counts`` (a 400), or None."""
        ...

    async def converge(self, operation: Operation, checkpoint: Checkpoint) -> None:
        """Bring the pools to ``operation.target``; set its status (done, failed,
        superseded) and detail. ``checkpoint`` shares progress (other replicas, GET)."""
        ...


class LocalReroling:
    """Re-role workers one step at a time (router/fleet/pool_control.py tells the steps)."""

    def __init__(
        self,
        settings: ControlSettings,
        *,
        registry: WorkerRegistry,
        load: InFlightLoad,
        blocks_held: Callable[[str], int],
        wanted: dict[str, WorkerRole],
        counts: Callable[[str], dict[WorkerRole, int]],
        wall_clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._load = load
        self._blocks_held = blocks_held
        self._wanted = wanted  # the controller's: shared with the other replicas
        self._counts = counts
        self._wall_clock = wall_clock

    def refusal(
        self, model: str, target: PoolTargets, counts: Mapping[WorkerRole, int]
    ) -> InvalidRequest | None:
        total = sum(counts.values())
        if target.prefill + target.decode == total:
            return None
        return InvalidRequest(
            f"prefill + decode must equal the model's {total} P/D workers "
            f"(re-roling moves workers between pools; it does not start new ones)",
            param="prefill",
        )

    async def converge(self, operation: Operation, checkpoint: Checkpoint) -> None:
        while not operation.superseded:
            step = self._next_step(operation)
            if not step:
                operation.status = "done"
                return
            operation.steps.extend(step)
            await checkpoint()
            switched = await self._switched(step)
            await checkpoint()
            if not switched:
                operation.status = "failed"
                operation.detail = (
                    f"not every worker of the step served its new role within "
                    f"{self._settings.rerole_timeout_s:.0f}s"
                )
                return
        operation.status = "superseded"

    def _next_step(self, operation: Operation) -> list[Step]:
        counts = self._counts(operation.model)
        surplus = next((r for r in PD_ROLES if counts[r] > operation.wants(r)), None)
        if surplus is None:
            return []
        other = WorkerRole.DECODE if surplus is WorkerRole.PREFILL else WorkerRole.PREFILL
        movable = [w for w in self._registry.workers()
                   if w.registration.model == operation.model and w.role is surplus]  # fmt: skip
        movable.sort(key=self._switch_cost)
        size = min(self._settings.rerole_step_workers, counts[surplus] - operation.wants(surplus))
        now = self._wall_clock()
        steps = [Step(w.worker_id, surplus, other, now) for w in movable[:size]]
        for step in steps:
            self._registry.hold(step.worker_id)
            self._wanted[step.worker_id] = step.to_role
            log.info("re-roling %s: %s -> %s", step.worker_id, surplus.value, other.value)
        return steps

    def _switch_cost(self, worker: WorkerState) -> tuple[int, int, str]:
        busy = self._load.of(worker.worker_id).requests + worker.load.num_requests_running
        return busy, self._blocks_held(worker.worker_id), worker.worker_id

    async def _switched(self, steps: list[Step]) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.rerole_timeout_s
        pending = {s.worker_id: s for s in steps}
        while pending:
            for worker_id, step in list(pending.items()):
                worker = self._registry.get(worker_id)
                if worker is not None and worker.role is step.to_role and worker.ready:
                    self._finish(step, "done")
                    del pending[worker_id]
            if pending and loop.time() > deadline:
                for step in pending.values():
                    self._finish(step, "timed_out")
                return False
            await asyncio.sleep(0.1)
        return True

    def _finish(self, step: Step, phase: Literal["done", "timed_out"]) -> None:
        step.phase, step.finished_unix_s = phase, self._wall_clock()
        self._wanted.pop(step.worker_id, None)
        self._registry.release(step.worker_id)


class PoolsView(Protocol):
    """What a scaler reads of the pool controller that runs it."""

    switching: dict[str, WorkerRole]
    wall_clock: Callable[[], float]

    def counts(self, model: str) -> dict[WorkerRole, int]: ...


def configured_scaler(
    settings: ControlSettings,
    *,
    registry: WorkerRegistry,
    load: InFlightLoad,
    blocks_held: Callable[[str], int],
    clock: Callable[[], float],
) -> Callable[[PoolsView], Scaler]:
    """The scaler ``settings.scaler`` names, made for the controller that will run it."""
    if settings.scaler == "kubernetes":
        # Imported only here: the official client is an optional extra (`kubernetes`).
        from router.fleet.kubernetes_scaler import KubernetesScaler, apps_api

        api = apps_api()  # a missing kubeconfig or service account fails the start

        def ready_counts(model: str) -> dict[WorkerRole, int]:
            counts = dict.fromkeys(PD_ROLES, 0)
            now = clock()
            for w in registry.workers():
                if w.registration.model == model and w.role in counts:
                    counts[w.role] += registry.is_eligible(w, now)
            return counts

        return lambda pools: KubernetesScaler(
            settings, ready_counts=ready_counts, wall_clock=pools.wall_clock, api=api
        )
    return lambda pools: LocalReroling(
        settings, registry=registry, load=load, blocks_held=blocks_held,
        wanted=pools.switching, counts=pools.counts, wall_clock=pools.wall_clock,
    )  # fmt: skip
