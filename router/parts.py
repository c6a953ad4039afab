"""``RouterParts``: every long-lived object of one router, built once (``app.build_parts``).

Handlers reach them on ``request.app.state.parts`` (``access.parts_of``). It lives here,
below the HTTP layer and beside the parts it names, so that nothing needs to import the
app: the app builds the parts and mounts the routes, and it is imported by nothing but
the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from contracts.workers import WorkerRegistration
from router.admission.admit import Admission
from router.admission.tenants import Tenants
from router.batch.tier import BatchTier
from router.fleet.pool_control import PoolController
from router.fleet.registry import WorkerRegistry
from router.fleet.state_sync import StateSync
from router.fleet.worker_networks import WorkerNetworks
from router.observability.fleet_accounting import FleetAccounting
from router.observability.metrics import RouterMetrics
from router.orchestration.pipeline import RequestPipeline
from router.orchestration.upstream import Upstream
from router.rollout.review import ReviewQueue
from router.rollout.rollout_control import RolloutControl
from router.rollout.rollout_path import RolloutPath
from router.scheduling.load import InFlightLoad
from router.scheduling.prefix_tracking import PrefixTracker
from router.scheduling.routing_stats import RoutingStats
from router.settings import RouterSettings
from router.state.base import ControlState


@dataclass(frozen=True, slots=True)
class RouterParts:
    """Every long-lived object of one router, built once; handlers reach them here."""

    settings: RouterSettings
    clock: Callable[[], float]
    aliases: dict[str, str]
    registry: WorkerRegistry
    upstream: Upstream
    load: InFlightLoad
    stats: RoutingStats
    prefixes: PrefixTracker
    metrics: RouterMetrics
    pipeline: RequestPipeline
    state: ControlState
    sync: StateSync
    pools: PoolController
    admin_tokens: dict[str, tuple[str, str]]  # token -> (name, scope)
    networks: WorkerNetworks
    tenants: Tenants
    accounting: FleetAccounting
    admission: Admission
    rollout: RolloutControl
    rollout_path: RolloutPath
    review: ReviewQueue
    on_registered: Callable[[WorkerRegistration, bool], None]
    batch: BatchTier
    wall_clock: Callable[[], float] = time.time

    def forget_worker(self, worker_id: str) -> None:
        forget_worker(worker_id, prefixes=self.prefixes, load=self.load, stats=self.stats)
        self.accounting.forget(worker_id)
        self.metrics.forget_worker(worker_id)


def forget_worker(
    worker_id: str, *, prefixes: PrefixTracker, load: InFlightLoad, stats: RoutingStats
) -> None:
    """A worker left the registry: drop what routing kept about it."""
    prefixes.on_gone(worker_id)
    load.forget(worker_id)
    stats.forget(worker_id)
