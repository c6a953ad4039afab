"""The router's Prometheus metrics, in a registry of their own per app."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from contracts.workers import WorkerRole
from router.admission_queue import PrefillQueue
from router.load import InFlightLoad
from router.prefix_index import PrefixIndex
from router.registry import WorkerRegistry
from router.routing_stats import RoutingStats, WorkerRouting

_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
)  # fmt: skip
_FAST_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class RouterMetrics:
    def __init__(
        self,
        *,
        registry: WorkerRegistry,
        load: InFlightLoad,
        index: PrefixIndex,
        stats: RoutingStats,
        clock: Callable[[], float],
    ) -> None:
        self.prometheus = CollectorRegistry(auto_describe=True)
        r = self.prometheus
        self.requests = Counter(
            "pdserve_requests", "Requests by outcome", ["model", "endpoint", "status"], registry=r
        )
        self._declare_latencies(r)
        self._declare_counters(r)
        self._declare_admission(r)
        r.register(_WorkerCollector(registry, clock))
        r.register(_RoutingCollector(registry, load, index, stats))

    def watch_admission(self, queues: Callable[[], Mapping[str, PrefillQueue]]) -> None:
        """Export each model's prefill queue at scrape time."""
        self.prometheus.register(_QueueCollector(queues))

    def _declare_latencies(self, r: CollectorRegistry) -> None:
        self.ttft = Histogram(
            "pdserve_time_to_first_token_seconds",
            "Arrival to first streamed byte, or to the whole answer when not streamed",
            ["model", "mode"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "pdserve_e2e_request_latency_seconds",
            "Arrival to last byte",
            ["model", "mode"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            "pdserve_inter_token_latency_seconds",
            "Gap between streamed chunks",
            ["model"],
            buckets=_ITL_BUCKETS_S,
            registry=r,
        )
        self.prefill_latency = Histogram(
            "pdserve_prefill_seconds",
            "Prefill call (max_tokens=1) including the handoff",
            ["model"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )

    def _declare_counters(self, r: CollectorRegistry) -> None:
        self.output_chunks = Counter(
            "pdserve_output_chunks", "Streamed SSE events relayed", ["model"], registry=r
        )
        self.upstream_failures = Counter(
            "pdserve_upstream_failures",
            "Worker calls that failed, by role and kind",
            ["role", "kind"],
            registry=r,
        )
        self.prefill_retries = Counter(
            "pdserve_prefill_retries", "Prefills retried on another worker", ["model"], registry=r
        )
        self.kv_lease_reprefills = Counter(
            "pdserve_kv_lease_reprefills",
            "Prefills redone because a decode failed after the KV lease ran out",
            ["model"],
            registry=r,
        )
        self.background_restarts = Counter(
            "pdserve_background_task_restarts",
            "Router background loops restarted after a crash (KV event feeds count in "
            'pdserve_kv_event_batches_total{kind="crash"})',
            ["task"],
            registry=r,
        )
        self.stream_errors = Counter(
            "pdserve_stream_errors", "Streams ended by an SSE error event", ["model"], registry=r
        )
        self.routing_decisions = Counter(
            "pdserve_routing_decisions",
            "Worker choices by pool, policy and reason (prefix_hit, bounded_load_spill, load, "
            "cold, round_robin, least_loaded)",
            ["model", "pool", "policy", "reason"],
            registry=r,
        )

    def _declare_admission(self, r: CollectorRegistry) -> None:
        self.admission_rejections = Counter(
            "pdserve_admission_rejections",
            "Requests refused by admission, by reason (rate_limit_rpm, rate_limit_tpm, "
            "ttft_slo_unattainable, queue_deadline, queue_full, decode_kv_full, "
            "decode_thrashing, prompt_over_tenant_cap)",
            ["model", "reason"],
            registry=r,
        )
        self.rejection_latency = Histogram(
            "pdserve_admission_rejection_seconds",
            "Arrival to the 429 for requests admission refused (queue waits included)",
            ["model", "reason"],
            buckets=_FAST_BUCKETS_S,
            registry=r,
        )
        self.predicted_ttft = Histogram(
            "pdserve_predicted_ttft_seconds",
            "Admission's predicted TTFT for each admitted request (compare with "
            "pdserve_time_to_first_token_seconds)",
            ["model"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.ttft_prediction_error = Histogram(
            "pdserve_ttft_prediction_error_seconds",
            "|observed - predicted| TTFT per admitted request: the predictor's error",
            ["model"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_wait = Histogram(
            "pdserve_admission_queue_wait_seconds",
            "Time admitted requests waited in the router's prefill queue",
            ["model"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.state_unavailable = Counter(
            "pdserve_rate_limit_unchecked",
            "Requests let through without a rate-limit check: the shared state was unreachable",
            registry=r,
        )


class _WorkerCollector(Collector):
    """Worker counts and engine load, read from the registry at scrape time."""

    def __init__(self, registry: WorkerRegistry, clock: Callable[[], float]) -> None:
        self._registry = registry
        self._clock = clock

    def collect(self) -> Iterable[GaugeMetricFamily]:
        eligible = GaugeMetricFamily(
            "pdserve_workers",
            "Registered workers by role and eligibility",
            labels=["role", "state"],
        )
        running = GaugeMetricFamily(
            "pdserve_worker_requests_running", "vLLM running requests", labels=["worker", "role"]
        )
        waiting = GaugeMetricFamily(
            "pdserve_worker_requests_waiting", "vLLM queue depth", labels=["worker", "role"]
        )
        kv = GaugeMetricFamily(
            "pdserve_worker_kv_cache_usage_perc", "vLLM KV cache usage", labels=["worker", "role"]
        )
        queries = GaugeMetricFamily(
            "pdserve_worker_prefix_cache_queries",
            "vLLM prefix_cache_queries (prompt tokens looked up), engine lifetime",
            labels=["worker", "role"],
        )
        hits = GaugeMetricFamily(
            "pdserve_worker_prefix_cache_hits",
            "vLLM prefix_cache_hits (prompt tokens found cached), engine lifetime",
            labels=["worker", "role"],
        )
        now = self._clock()
        counts: dict[tuple[str, str], int] = {}
        for w in self._registry.workers():
            state = "ready" if self._registry.is_eligible(w, now) else "not_ready"
            key = (w.role.value, state)
            counts[key] = counts.get(key, 0) + 1
            labels = [w.worker_id, w.role.value]
            running.add_metric(labels, w.load.num_requests_running)
            waiting.add_metric(labels, w.load.num_requests_waiting)
            kv.add_metric(labels, w.load.kv_cache_usage_perc)
            queries.add_metric(labels, w.load.prefix_cache_queries)
            hits.add_metric(labels, w.load.prefix_cache_hits)
        for (role, state), count in counts.items():
            eligible.add_metric([role, state], count)
        yield from (eligible, running, waiting, kv, queries, hits)


class _RoutingCollector(Collector):
    """The prefix index and the routing decisions, read at scrape time from snapshots."""

    def __init__(
        self,
        registry: WorkerRegistry,
        load: InFlightLoad,
        index: PrefixIndex,
        stats: RoutingStats,
    ) -> None:
        self._registry = registry
        self._load = load
        self._index = index
        self._stats = stats

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        index, routing, load = self._index, self._stats.snapshot(), self._load.snapshot()
        size = GaugeMetricFamily("pdserve_prefix_index_blocks", "Distinct blocks indexed")
        size.add_metric([], len(index))
        held = GaugeMetricFamily(
            "pdserve_prefix_index_worker_blocks", "Blocks indexed per worker", labels=["worker"]
        )
        ratio = GaugeMetricFamily(
            "pdserve_prefix_hit_ratio",
            "Prompt tokens found cached: predicted by the router at routing time, and observed "
            "by the engine (vLLM prefix_cache_hits / queries over its lifetime)",
            labels=["worker", "source"],
        )
        inflight = GaugeMetricFamily(
            "pdserve_worker_inflight_requests", "Requests this router has in flight on a worker",
            labels=["worker"],
        )  # fmt: skip
        routed = CounterMetricFamily(
            "pdserve_routed_requests", "Requests sent to each worker (retries included)",
            labels=["worker", "role"],
        )  # fmt: skip
        for worker in self._registry.workers():
            wid = worker.worker_id
            routed_here = routing.workers.get(wid, WorkerRouting())
            routed.add_metric([wid, worker.role.value], routed_here.routed_requests)
            held.add_metric([wid], index.blocks_held(wid))
            inflight.add_metric([wid], load[wid].requests if wid in load else 0)
            if routed_here.predicted_hit_ratio is not None:
                ratio.add_metric([wid, "predicted"], routed_here.predicted_hit_ratio)
            if worker.load.prefix_cache_queries:
                observed = worker.load.prefix_cache_hits / worker.load.prefix_cache_queries
                ratio.add_metric([wid, "observed"], observed)
        hotspot = GaugeMetricFamily(
            "pdserve_hotspot_factor",
            "Workers x the largest share of the recent routing decisions in a pool (1 = even)",
            labels=["pool"],
        )
        for role in WorkerRole:
            workers = sum(1 for w in self._registry.workers() if w.role is role)
            factor = routing.hotspot_factor(role, workers)
            if factor is not None:
                hotspot.add_metric([role.value], factor)
        events = CounterMetricFamily(
            "pdserve_kv_event_batches",
            "KV event batches received, and gaps/restarts detected, per worker",
            labels=["worker", "kind"],
        )
        for (wid, kind), count in routing.kv_event_batches.items():
            events.add_metric([wid, kind], count)
        yield from (size, held, ratio, inflight, routed, hotspot, events)


class _QueueCollector(Collector):
    """Admission's prefill queues: what is admitted and what waits, per model."""

    def __init__(self, queues: Callable[[], Mapping[str, PrefillQueue]]) -> None:
        self._queues = queues

    def collect(self) -> Iterable[GaugeMetricFamily]:
        admitted = GaugeMetricFamily(
            "pdserve_prefill_queue_admitted_tokens",
            "Uncached prompt tokens admitted and not yet prefilled",
            labels=["model"],
        )
        limit = GaugeMetricFamily(
            "pdserve_prefill_queue_limit_tokens", "The prefill queue's bound", labels=["model"]
        )
        waiting = GaugeMetricFamily(
            "pdserve_prefill_queue_waiting_requests", "Requests waiting in the router",
            labels=["model"],
        )  # fmt: skip
        waiting_tokens = GaugeMetricFamily(
            "pdserve_prefill_queue_waiting_tokens", "Uncached tokens waiting in the router",
            labels=["model"],
        )  # fmt: skip
        for model, queue in self._queues().items():
            admitted.add_metric([model], queue.admitted_tokens)
            limit.add_metric([model], queue.limit_tokens)
            waiting.add_metric([model], queue.waiting)
            waiting_tokens.add_metric([model], queue.waiting_tokens)
        yield from (admitted, limit, waiting, waiting_tokens)
