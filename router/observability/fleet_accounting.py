"""What the fleet did and cost, per model and pool, from the heartbeats this replica gets.

Each heartbeat adds, for its worker's (model, pool):
- the worker-seconds since its previous heartbeat here (at most ``max_gap_s``), and
  their cost at the worker kind's price;
- the growth of the engine's lifetime counters (prefix-cache queries and hits, the KV
  connector's external hits, NIXL transfers, bytes, seconds and failures, preemptions).
  A counter that went down is a restarted engine: its new value is the growth.

Why heartbeats: an agent reports to one router replica at a time, so summing these
counters over replicas (as Prometheus does) counts every second and every token once.
A router that has not seen a worker's engine register takes its first heartbeat as
the baseline (a restarted router must not count an engine's whole past again).

Invariants: the maps are keyed by bounded label values (models x pools x kinds, and
registered workers, forgotten with them); the clock is passed in.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from contracts.workers import WorkerHeartbeat, WorkerLoad, WorkerRegistration
from router.observability.cost import usd_per_hour
from router.observability.windows import SlidingSums

# Lifetime engine counters (WorkerLoad fields) accumulated per pool.
ENGINE_COUNTERS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    "kv_transfers",
    "kv_transfer_seconds",
    "kv_transfer_bytes",
    "kv_transfer_failures",
    "num_preemptions",
)


@dataclass(frozen=True, slots=True)
class PoolKey:
    model: str
    pool: str  # the worker's role: prefill, decode or colocated


class FleetSink(Protocol):
    """Where the growth goes as it is found (the metrics' counters)."""

    def count_worker_time(self, key: PoolKey, kind: str, seconds: float, usd: float) -> None: ...

    def count_engine(self, key: PoolKey, field: str, delta: float) -> None: ...


class _NoSink:
    def count_worker_time(self, key: PoolKey, kind: str, seconds: float, usd: float) -> None:
        pass

    def count_engine(self, key: PoolKey, field: str, delta: float) -> None:
        pass


@dataclass(slots=True)
class _Seen:
    incarnation: int
    at_s: float
    load: WorkerLoad


class FleetAccounting:
    def __init__(
        self,
        prices: dict[str, float],
        *,
        max_gap_s: float,
        window: SlidingSums,
        clock: Callable[[], float],
        sink: FleetSink | None = None,
    ) -> None:
        self._prices = prices
        self._sink = sink or _NoSink()
        self._max_gap_s = max_gap_s
        self._window = window  # cost in $ per PoolKey over the metrics window
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        self.worker_seconds: collections.Counter[tuple[PoolKey, str]] = collections.Counter()
        self.cost_usd: collections.Counter[PoolKey] = collections.Counter()
        self.engine: dict[PoolKey, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )

    def registered(self, registration: WorkerRegistration) -> None:
        """An engine registered here: its counters start from zero, its time from now."""
        self._seen[registration.worker_id] = _Seen(
            registration.incarnation, self._clock(), WorkerLoad()
        )

    def heartbeat(self, registration: WorkerRegistration, beat: WorkerHeartbeat) -> None:
        now = self._clock()
        seen = self._seen.get(registration.worker_id)
        # A beat without a read of the engine (not ready, /metrics unreadable) carries
        # zeros, not counts: the last real read stays the baseline.
        counted = beat.ready and beat.load.known and beat.incarnation == registration.incarnation
        if seen is None:
            if counted:  # first sight since this router started: the baseline
                self._seen[registration.worker_id] = _Seen(beat.incarnation, now, beat.load)
            return
        baseline = beat.load if counted else seen.load
        self._seen[registration.worker_id] = _Seen(registration.incarnation, now, baseline)
        key = PoolKey(registration.model, registration.role.value)
        seconds = min(max(0.0, now - seen.at_s), self._max_gap_s)
        usd = seconds / 3600 * usd_per_hour(self._prices, registration.accelerator)
        self.worker_seconds[key, registration.accelerator] += seconds
        self.cost_usd[key] += usd
        self._window.add(key, usd)
        self._sink.count_worker_time(key, registration.accelerator, seconds, usd)
        if not counted:
            return
        same_engine = seen.incarnation == registration.incarnation
        counters = self.engine[key]
        for name in ENGINE_COUNTERS:
            new, old = getattr(beat.load, name), getattr(seen.load, name)
            delta = new - old if same_engine and new >= old else new
            if delta:
                counters[name] += delta
                self._sink.count_engine(key, name, delta)

    def forget(self, worker_id: str) -> None:
        self._seen.pop(worker_id, None)

    def window_cost_usd(self, key: PoolKey) -> float:
        return self._window.total(key)

    def pools(self) -> list[PoolKey]:
        keys = {k for k, _ in self.worker_seconds} | set(self.engine)
        return sorted(keys, key=lambda k: (k.model, k.pool))
