"""The router's Prometheus metrics, in a registry of their own per app.

Labels and their bound (no label ever holds a request, prompt, tenant key or version):
- ``model``: served models and aliases (registered workers' models, at most
  ``max_workers``), or ``unknown`` for a 404;
- ``pool`` / ``role``: prefill, decode, colocated; ``mode``: disaggregated, colocated,
  decode_local; ``stage``: queue, prefill, kv_handoff, decode; ``direction``: input,
  output; ``tenant_class``: interactive, standard, batch;
- ``worker``: registered workers (at most ``max_workers``; a forgotten worker's series
  go with it); ``kind``: worker kinds the agents report (cpu, accelerator names);
- ``reason``, ``status``, ``endpoint``, ``kind`` of failures: fixed sets in the code.
So a histogram has at most models x 3 x 3 series, and per-worker gauges one per worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from contracts.workers import WorkerRole
from router.admission_queue import PrefillQueue
from router.fleet_accounting import FleetAccounting
from router.load import InFlightLoad
from router.prefix_index import PrefixIndex
from router.registry import WorkerRegistry
from router.routing_stats import RoutingStats, WorkerRouting
from router.usage import Usage
from router.windows import RecentSamples, SlidingSums

# Milliseconds to minutes: a cached short prompt on a GPU to a long context queued on CPU.
_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
    81.92, 163.84, 327.68,
)  # fmt: skip
_FAST_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30)
_ITL_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
)  # fmt: skip
DIRECTIONS = ("input", "output")


class RouterMetrics:
    def __init__(
        self,
        *,
        registry: WorkerRegistry,
        load: InFlightLoad,
        index: PrefixIndex,
        stats: RoutingStats,
        accounting: FleetAccounting,
        window_s: float,
        recent_ttft_samples: int,
        clock: Callable[[], float],
    ) -> None:
        self.prometheus = CollectorRegistry(auto_describe=True)
        r = self.prometheus
        self.requests = Counter(
            "pdserve_requests", "Requests by outcome", ["model", "endpoint", "status"], registry=r
        )
        self.tokens_window = SlidingSums(window_s=window_s, bucket_s=1.0, clock=clock)
        self.recent_ttft = RecentSamples(
            window_s=window_s, max_samples=recent_ttft_samples, clock=clock
        )
        self._declare_latencies(r)
        self._declare_counters(r)
        self._declare_admission(r)
        r.register(_WorkerCollector(registry, clock))
        r.register(_RoutingCollector(registry, load, index, stats))
        r.register(_FleetCollector(accounting, self.tokens_window))

    def observe_ttft(self, model: str, mode: str, tenant_class: str, seconds: float) -> None:
        self.ttft.labels(model, mode, tenant_class).observe(seconds)
        self.recent_ttft.add(model, seconds)

    def observe_usage(
        self, model: str, tenant_class: str, usage: Usage, *, counts_prompt: bool = True
    ) -> None:
        """Count an answer's tokens; a later choice of a fan-out shares its prompt."""
        prompt = usage.prompt_tokens if counts_prompt else 0
        self.prompt_tokens.labels(model, tenant_class).inc(prompt)
        self.generation_tokens.labels(model, tenant_class).inc(usage.completion_tokens)
        self.tokens_window.add((model, "input"), prompt)
        self.tokens_window.add((model, "output"), usage.completion_tokens)

    def tokens_per_s(self, model: str, direction: str) -> float:
        return self.tokens_window.total((model, direction)) / self.tokens_window.span_s()

    def watch_admission(self, queues: Callable[[], Mapping[str, PrefillQueue]]) -> None:
        """Export each model's prefill queue at scrape time."""
        self.prometheus.register(_QueueCollector(queues))

    def watch_state(self, up: Callable[[], bool]) -> None:
        """Export whether the shared state backend answers (the memory one always does)."""
        gauge = Gauge(
            "pdserve_state_backend_up",
            "1 while the control state backend answers; 0 while the router serves on its "
            "last view (Redis down)",
            registry=self.prometheus,
        )
        gauge.set_function(lambda: 1.0 if up() else 0.0)

    def _declare_latencies(self, r: CollectorRegistry) -> None:
        self.ttft = Histogram(
            "pdserve_time_to_first_token_seconds",
            "Arrival to first streamed byte, or to the whole answer when not streamed",
            ["model", "mode", "tenant_class"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "pdserve_e2e_request_latency_seconds",
            "Arrival to last byte",
            ["model", "mode", "tenant_class"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.tpot = Histogram(
            "pdserve_time_per_output_token_seconds",
            "Per streamed request: first to last byte over the output tokens after the first",
            ["model"],
            buckets=_ITL_BUCKETS_S,
            registry=r,
        )
        self.stage = Histogram(
            "pdserve_request_stage_seconds",
            "Time in each stage: queue (admission's prefill queue), prefill (the prefill "
            "call), kv_handoff (streams: handoff issued to the decode's first byte, i.e. the "
            "KV pull and the first step), decode (streams: first byte to last; whole answers: "
            "the decode call, KV pull included)",
            ["model", "stage"],
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

    def _declare_counters(self, r: CollectorRegistry) -> None:
        self.prompt_tokens = Counter(
            "pdserve_prompt_tokens",
            "Prompt tokens of answered requests (the engines' usage, as clients get it)",
            ["model", "tenant_class"],
            registry=r,
        )
        self.generation_tokens = Counter(
            "pdserve_generation_tokens",
            "Output tokens of answered requests (the engines' usage, as clients get it)",
            ["model", "tenant_class"],
            registry=r,
        )
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
        self.limit_rejections = Counter(
            "pdserve_limit_rejections",
            "Requests refused (400) by a size limit, by code: context_length_exceeded, "
            "model_/tenant_prompt_limit, model_/tenant_output_limit, too_many_messages, "
            "message_too_long",
            ["model", "reason"],
            registry=r,
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
            "Registered workers by model, role and eligibility (the P:D counts)",
            labels=["model", "role", "state"],
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
        memory = GaugeMetricFamily(
            "pdserve_worker_engine_memory_bytes",
            "Resident host memory of the engine's processes (measured by its agent)",
            labels=["worker", "role"],
        )
        accelerator = GaugeMetricFamily(
            "pdserve_worker_accelerator_memory_bytes",
            "Accelerator memory the engine's processes use, and its devices' total (NVML; "
            "absent on CPU)",
            labels=["worker", "role", "kind"],
        )
        now = self._clock()
        counts: dict[tuple[str, str, str], int] = {}
        for w in self._registry.workers():
            state = "ready" if self._registry.is_eligible(w, now) else "not_ready"
            key = (w.registration.model, w.role.value, state)
            counts[key] = counts.get(key, 0) + 1
            labels = [w.worker_id, w.role.value]
            running.add_metric(labels, w.load.num_requests_running)
            waiting.add_metric(labels, w.load.num_requests_waiting)
            kv.add_metric(labels, w.load.kv_cache_usage_perc)
            queries.add_metric(labels, w.load.prefix_cache_queries)
            hits.add_metric(labels, w.load.prefix_cache_hits)
            memory.add_metric(labels, w.load.engine_memory_bytes)
            if w.load.accelerator_memory_total_bytes:
                accelerator.add_metric([*labels, "used"], w.load.accelerator_memory_used_bytes)
                accelerator.add_metric([*labels, "total"], w.load.accelerator_memory_total_bytes)
        for (model, role, state), count in counts.items():
            eligible.add_metric([model, role, state], count)
        yield from (eligible, running, waiting, kv, queries, hits, memory, accelerator)


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
        yield from _pool_queues(self._registry, load)
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


def _pool_queues(
    registry: WorkerRegistry, load: Mapping[str, object]
) -> Iterable[GaugeMetricFamily]:
    depth = GaugeMetricFamily(
        "pdserve_pool_queue_depth",
        "Requests waiting in the pool's engines (vLLM num_requests_waiting, summed)",
        labels=["model", "pool"],
    )
    tokens = GaugeMetricFamily(
        "pdserve_pool_queued_prefill_tokens",
        "Uncached prompt tokens this router has sent to the pool and not yet seen prefilled",
        labels=["model", "pool"],
    )
    waiting: dict[tuple[str, str], float] = {}
    queued: dict[tuple[str, str], float] = {}
    for w in registry.workers():
        key = (w.registration.model, w.role.value)
        waiting[key] = waiting.get(key, 0.0) + w.load.num_requests_waiting
        inflight = load.get(w.worker_id)
        queued[key] = queued.get(key, 0.0) + (inflight.tokens if inflight is not None else 0)
    for key, value in waiting.items():
        depth.add_metric(list(key), value)
        tokens.add_metric(list(key), queued[key])
    yield from (depth, tokens)


_ENGINE_COUNTER_DOCS = {
    "prefix_cache_queries": ("pdserve_pool_prefix_cache_queries",
                             "Prompt tokens the pool's engines looked up in their prefix cache"),
    "prefix_cache_hits": ("pdserve_pool_prefix_cache_hits",
                          "Prompt tokens found in the pool's own prefix caches"),
    "external_prefix_cache_hits": ("pdserve_pool_external_prefix_cache_hits",
                                   "Prompt tokens the pool pulled from a peer (decode: the "
                                   "prefilled prompt over NIXL; not a miss)"),
    "kv_transfers": ("pdserve_kv_transfers", "KV transfers the pool's engines pulled (NIXL)"),
    "kv_transfer_seconds": ("pdserve_kv_transfer_seconds", "Seconds spent in KV transfers"),
    "kv_transfer_bytes": ("pdserve_kv_transfer_bytes", "Bytes moved by KV transfers"),
    "kv_transfer_failures": ("pdserve_kv_transfer_failures",
                             "Failed KV transfers (handshake and notification failures too)"),
    "num_preemptions": ("pdserve_pool_preemptions",
                        "Requests the pool's engines preempted: KV ran out mid-decode"),
}  # fmt: skip


class _FleetCollector(Collector):
    """Per model and pool, from the heartbeats this replica got (``fleet_accounting``):
    worker-seconds, cost and the engines' counters; over the metrics window: tokens/s
    and $/1M tokens."""

    def __init__(self, accounting: FleetAccounting, tokens: SlidingSums) -> None:
        self._accounting = accounting
        self._tokens = tokens

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        a = self._accounting
        seconds = CounterMetricFamily(
            "pdserve_worker_seconds", "Seconds workers were registered, by kind",
            labels=["model", "pool", "kind"],
        )  # fmt: skip
        for (key, kind), value in a.worker_seconds.items():
            seconds.add_metric([key.model, key.pool, kind], value)
        cost = CounterMetricFamily(
            "pdserve_cost_usd", "Worker cost at the cost model's $/hour",
            labels=["model", "pool"],
        )  # fmt: skip
        for key, value in a.cost_usd.items():
            cost.add_metric([key.model, key.pool], value)
        yield from (seconds, cost, *self._engine_counters(), *self._window_gauges())

    def _engine_counters(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        families = {
            field: CounterMetricFamily(name, doc, labels=["model", "pool"])
            for field, (name, doc) in _ENGINE_COUNTER_DOCS.items()
        }
        ratio = GaugeMetricFamily(
            "pdserve_pool_prefix_hit_ratio",
            "Prompt tokens not computed: own prefix-cache hits plus (decode) pulled KV, over "
            "the tokens looked up, since this router started",
            labels=["model", "pool"],
        )
        for key, counters in self._accounting.engine.items():
            for field, family in families.items():
                family.add_metric([key.model, key.pool], counters[field])
            if counters["prefix_cache_queries"]:
                found = counters["prefix_cache_hits"] + counters["external_prefix_cache_hits"]
                ratio.add_metric(
                    [key.model, key.pool], min(1.0, found / counters["prefix_cache_queries"])
                )
        yield from (*families.values(), ratio)

    def _window_gauges(self) -> Iterable[GaugeMetricFamily]:
        span_s = self._tokens.span_s()
        rate = GaugeMetricFamily(
            "pdserve_tokens_per_second",
            "Tokens answered per second over metrics_window_s",
            labels=["model", "direction"],
        )
        per_million = GaugeMetricFamily(
            "pdserve_cost_usd_per_million_tokens",
            "Over metrics_window_s: the pool's cost (pool=all: every pool of the model) per "
            "million tokens answered in that direction",
            labels=["model", "pool", "direction"],
        )
        for model, direction in self._tokens.window_keys():
            count = self._tokens.total((model, direction))
            rate.add_metric([model, direction], count / span_s)
        for model in sorted({k.model for k in self._accounting.pools()}):
            prices = usd_per_million_tokens(self._accounting, self._tokens, model)
            for (pool, direction), usd in prices.items():
                per_million.add_metric([model, pool, direction], usd)
        yield from (rate, per_million)


def usd_per_million_tokens(
    accounting: FleetAccounting, tokens: SlidingSums, model: str
) -> dict[tuple[str, str], float]:
    """(pool, direction) -> the pool's cost per million tokens answered in that direction,
    over the window; pool "all" is every pool of the model. No tokens: no figure."""
    costs = {k.pool: accounting.window_cost_usd(k) for k in accounting.pools() if k.model == model}
    costs["all"] = sum(costs.values())
    prices = {}
    for direction in DIRECTIONS:
        count = tokens.total((model, direction))
        if count > 0:
            prices.update({(pool, direction): usd / count * 1e6 for pool, usd in costs.items()})
    return prices
