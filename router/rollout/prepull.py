"""A canary's pre-pull: its version pulled into N workers' node caches before it gets
traffic (``CanaryStage.prepull_workers``), so that the canary's pods, and later prod's,
never wait on a download.

Which workers pull is the same on every router replica without any coordination:
among the model's workers, those that already have the version first, then by a hash of
(version, worker id), the first N. A chosen worker that has not pulled the version is
told to in its heartbeat's reply (``PullOrder``); it pulls beside the version it serves
(nothing restarts) and reports the version in its next heartbeats, which reach every
replica through the shared state. The gate opens when N workers report it; a worker
that leaves makes room for the next in hash order.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
from collections.abc import Callable, Iterable

from contracts.rollout import RouteSpec
from contracts.workers import PullOrder
from router.fleet.registry import WorkerState
from router.rollout.rollout import Rollout


def pulled_count(model: str, version: str, workers: Iterable[WorkerState]) -> int:
    return sum(w.registration.model == model and version in w.pulled_versions for w in workers)


def chosen_workers(
    model: str, version: str, workers: Iterable[WorkerState], count: int
) -> set[str]:
    """The ``count`` workers of ``model`` that hold (or are to pull) ``version``. Asked
    at every heartbeat of a worker still to pull: the hashes are memoized, and only the
    ``count`` smallest ranks are kept, not a sort of the fleet."""
    mine = (w for w in workers if w.registration.model == model)

    def rank(worker: WorkerState) -> tuple[bool, str]:
        return version not in worker.pulled_versions, _digest(version, worker.worker_id)

    return {w.worker_id for w in heapq.nsmallest(count, mine, key=rank)}


@functools.lru_cache(maxsize=8192)
def _digest(version: str, worker_id: str) -> str:
    return hashlib.sha256(f"{version}\0{worker_id}".encode()).hexdigest()


def gate_open(spec: RouteSpec, model: str, workers: Callable[[], Iterable[WorkerState]]) -> bool:
    """May the canary get traffic: pre-pulled on as many workers as it asks (if any)?
    ``workers`` is called only when a pre-pull is asked: a canary request without one
    reads no fleet."""
    canary = spec.canary
    if canary is None or not canary.prepull_workers:
        return True
    return pulled_count(model, canary.version, workers()) >= canary.prepull_workers


def pull_order(
    rollout: Rollout, worker: WorkerState, workers: Callable[[], Iterable[WorkerState]]
) -> PullOrder | None:
    """What ``worker`` should pull now for its model's canary, if anything. Asked at
    every heartbeat: ``workers`` is called only while this worker may still pull."""
    model = worker.registration.model
    route = rollout.route(model)
    canary = None if route is None else route.spec.canary
    if canary is None or not canary.prepull_workers or canary.version in worker.pulled_versions:
        return None
    if worker.worker_id not in chosen_workers(model, canary.version, workers(),
                                              canary.prepull_workers):  # fmt: skip
        return None
    artifact = rollout.artifact(model, canary.version)
    if artifact is None:
        return None
    return PullOrder(version=canary.version, artifact=artifact.artifact, checksum=artifact.checksum)
