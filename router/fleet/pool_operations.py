"""What a P:D ratio change is while it runs: an operation and its steps, as GET
``/admin/v1/operations/{id}`` shows them (and the shared state keeps them for the other
replicas)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from contracts.workers import WorkerRole
from router.state.base import PoolTargets

PD_ROLES = (WorkerRole.PREFILL, WorkerRole.DECODE)
OperationStatus = Literal["running", "done", "superseded", "failed"]
StepPhase = Literal["draining", "scaling", "done", "timed_out"]
# Shares an operation's progress (the other replicas, GET): a scaler calls it after a step.
Checkpoint = Callable[[], Awaitable[None]]


class OperationStep(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class Step:
    """One worker re-roled in place (the local scaler)."""

    worker_id: str
    from_role: WorkerRole
    to_role: WorkerRole
    started_unix_s: float
    phase: StepPhase = "draining"
    finished_unix_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id, "from": self.from_role.value, "to": self.to_role.value,
            "phase": self.phase, "started_unix_s": self.started_unix_s,
            "finished_unix_s": self.finished_unix_s,
        }  # fmt: skip


@dataclass(slots=True)
class ScaleStep:
    """One pool's Deployment scaled (the Kubernetes scaler)."""

    deployment: str
    role: WorkerRole
    from_replicas: int
    to_replicas: int
    started_unix_s: float
    phase: StepPhase = "scaling"
    finished_unix_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment, "role": self.role.value,
            "from_replicas": self.from_replicas, "to_replicas": self.to_replicas,
            "phase": self.phase, "started_unix_s": self.started_unix_s,
            "finished_unix_s": self.finished_unix_s,
        }  # fmt: skip


@dataclass(slots=True)
class Operation:
    id: str
    model: str
    target: PoolTargets
    actor: str
    created_unix_s: float
    status: OperationStatus = "running"
    detail: str = ""
    steps: list[OperationStep] = field(default_factory=list)
    finished_unix_s: float | None = None
    superseded: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "model": self.model, "target": self.target.as_dict(),
            "actor": self.actor, "status": self.status, "detail": self.detail,
            "created_unix_s": self.created_unix_s, "finished_unix_s": self.finished_unix_s,
            "steps": [s.as_dict() for s in self.steps],
        }  # fmt: skip

    def wants(self, role: WorkerRole) -> int:
        return self.target.prefill if role is WorkerRole.PREFILL else self.target.decode
