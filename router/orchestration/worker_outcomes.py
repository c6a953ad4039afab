"""What an attempt on a worker says about it: the circuit breaker's count, the failure
metrics, and whether the client or the worker was at fault. Shared by every request
path that calls engines (generation, embeddings), so a worker that fails one is ejected
for all.

Rules (``triage``): an engine 4xx is the client's fault, passed on as is
(``UpstreamRejected``); an unreachable engine opens its circuit at once; a 5xx, an
abort or a bad handoff counts toward it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from router.errors import UpstreamRejected
from router.fleet.registry import WorkerRegistry, WorkerState
from router.observability.metrics import RouterMetrics
from router.orchestration.engine_errors import EngineAborted, EngineHTTPError, EngineUnreachable

log = logging.getLogger("pdserve.router")


class WorkerOutcomes:
    def __init__(
        self, registry: WorkerRegistry, metrics: RouterMetrics, clock: Callable[[], float]
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._clock = clock

    def __repr__(self) -> str:
        return "WorkerOutcomes()"

    def triage(self, worker: WorkerState, error: Exception) -> str:
        """Count and log a failed attempt and say what happened; an engine 4xx is re-raised."""
        if not (isinstance(error, EngineHTTPError) and error.status < 500):
            log.warning("%s %s attempt failed: %s", worker.worker_id, worker.role.value, error)
        if isinstance(error, EngineUnreachable):
            self.failed(worker, "unreachable", at_once=True)
            return f"{worker.worker_id}: unreachable ({error})"
        if isinstance(error, EngineHTTPError):
            if error.status < 500:
                raise UpstreamRejected(error.status, error.body) from None
            self.failed(worker, f"http_{error.status}")
            return f"{worker.worker_id}: HTTP {error.status}"
        if isinstance(error, EngineAborted):  # shutting down: leaves rotation as it drains
            self.failed(worker, "aborted")
            return f"{worker.worker_id}: the engine aborted the request"
        self.failed(worker, "bad_handoff")
        return f"{worker.worker_id}: {error}"

    def failed(self, worker: WorkerState, kind: str, *, at_once: bool = False) -> None:
        """Count a failed request; ``at_once``: the engine is gone, open its circuit now."""
        self._metrics.upstream_failures.labels(worker.role.value, kind).inc()
        if self._registry.request_failed(worker.worker_id, self._clock(), at_once=at_once):
            breaker = worker.breaker
            log.warning("%s: circuit open for %.0f s after %d failed requests (last: %s)",
                        worker.worker_id, breaker.open_for_s, breaker.failures, kind)  # fmt: skip
            self._metrics.circuit_trips.labels(worker.worker_id).inc()
            self._metrics.circuit_open.labels(worker.worker_id).set(1)

    def answered(self, worker: WorkerState) -> None:
        if self._registry.request_succeeded(worker.worker_id, self._clock()):
            log.info("%s: circuit closed, its trial request succeeded", worker.worker_id)
            self._metrics.circuit_open.labels(worker.worker_id).set(0)
