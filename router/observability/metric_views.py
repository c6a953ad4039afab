"""The router's metrics that are views, not counts: read from shared state at scrape
time, published from each process's own state, or derived from the summed series.

- ``WorkerCollector``, ``SharedStateCollector``: what every router process holds alike
  (the worker registry with the engines' load, the prefix index, the KV event feeds),
  read by whichever process serves the scrape;
- ``process_gauge_publisher``: what one process holds alone (in-flight requests, its
  admission queue, its windows of tokens and cost), set as gauges that add up over
  processes (``RouterMetrics`` declares their multiprocess modes);
- ``derived``: ratios computed from the summed series, so that several processes give
  one right answer: prefix hit ratios, tokens/s, $/1M tokens.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from contracts.workers import WorkerRole
from router.admission.admission_queue import PrefillQueue
from router.admission.ttft_predictor import TTFTPredictor
from router.fleet.registry import WorkerRegistry
from router.observability.fleet_accounting import FleetAccounting
from router.observability.metrics import RouterMetrics
from router.orchestration.engine_client import EngineClient
from router.scheduling.load import InFlightLoad
from router.scheduling.prefix_index import PrefixIndex
from router.scheduling.routing_stats import RoutingStats

DIRECTIONS = ("input", "output")
Labels = frozenset[tuple[str, str]]


class WorkerCollector(Collector):
    """Worker counts, engine load and memory, read from the registry at scrape time."""

    def __init__(self, registry: WorkerRegistry, clock: Callable[[], float]) -> None:
        self._registry = registry
        self._clock = clock

    def collect(self) -> Iterable[GaugeMetricFamily]:
        per_worker = {
            "running": ("pdserve_worker_requests_running", "vLLM running requests"),
            "waiting": ("pdserve_worker_requests_waiting", "vLLM queue depth"),
            "kv": ("pdserve_worker_kv_cache_usage_perc", "vLLM KV cache usage"),
            "queries": ("pdserve_worker_prefix_cache_queries",
                        "vLLM prefix_cache_queries (prompt tokens looked up), engine lifetime"),
            "hits": ("pdserve_worker_prefix_cache_hits",
                     "vLLM prefix_cache_hits (prompt tokens found cached), engine lifetime"),
            "memory": ("pdserve_worker_engine_memory_bytes",
                       "Resident host memory of the engine's processes (measured by its agent)"),
        }  # fmt: skip
        families = {
            key: GaugeMetricFamily(name, doc, labels=["worker", "role"])
            for key, (name, doc) in per_worker.items()
        }
        eligible = GaugeMetricFamily(
            "pdserve_workers",
            "Registered workers by model, role and eligibility (the P:D counts)",
            labels=["model", "role", "state"],
        )
        accelerator = GaugeMetricFamily(
            "pdserve_worker_accelerator_memory_bytes",
            "Accelerator memory the engine's processes use, and its devices' total (NVML; "
            "absent on CPU)",
            labels=["worker", "role", "kind"],
        )
        start = GaugeMetricFamily(
            "pdserve_worker_start_seconds",
            "Seconds of each part of the worker's engine start, as its agent measured them: "
            "pull, process_start, weights_load, engine_warm_up (or engine_start whole), probe",
            labels=["worker", "role", "phase"],
        )
        now = self._clock()
        counts: dict[tuple[str, str, str], int] = defaultdict(int)
        for w in self._registry.workers():
            state = "ready" if self._registry.is_eligible(w, now) else "not_ready"
            counts[w.registration.model, w.role.value, state] += 1
            labels, load = [w.worker_id, w.role.value], w.load
            for key, value in (("running", load.num_requests_running),
                               ("waiting", load.num_requests_waiting),
                               ("kv", load.kv_cache_usage_perc),
                               ("queries", load.prefix_cache_queries),
                               ("hits", load.prefix_cache_hits),
                               ("memory", load.engine_memory_bytes)):  # fmt: skip
                families[key].add_metric(labels, value)
            for phase, seconds in w.registration.start_phases.items():
                start.add_metric([*labels, phase], seconds)
            if load.accelerator_memory_total_bytes:
                accelerator.add_metric([*labels, "used"], load.accelerator_memory_used_bytes)
                accelerator.add_metric([*labels, "total"], load.accelerator_memory_total_bytes)
        for (model, role, state), count in counts.items():
            eligible.add_metric([model, role, state], count)
        yield from (eligible, *families.values(), accelerator, start)


class SharedStateCollector(Collector):
    """The prefix index, the engines' queues per pool, and the KV event feeds: every
    router process follows the same feeds and registry, so any one of them can answer."""

    def __init__(self, registry: WorkerRegistry, index: PrefixIndex, stats: RoutingStats) -> None:
        self._registry = registry
        self._index = index
        self._stats = stats

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        index = self._index
        size = GaugeMetricFamily("pdserve_prefix_index_blocks", "Distinct blocks indexed")
        size.add_metric([], len(index))
        held = GaugeMetricFamily(
            "pdserve_prefix_index_worker_blocks", "Blocks indexed per worker", labels=["worker"]
        )
        observed = GaugeMetricFamily(
            "pdserve_prefix_hit_ratio",
            "Prompt tokens found cached: predicted by the router at routing time, and observed "
            "by the engine (vLLM prefix_cache_hits / queries over its lifetime)",
            labels=["worker", "source"],
        )
        depth = GaugeMetricFamily(
            "pdserve_pool_queue_depth",
            "Requests waiting in the pool's engines (vLLM num_requests_waiting, summed)",
            labels=["model", "pool"],
        )
        kv = GaugeMetricFamily(
            "pdserve_pool_kv_cache_usage_perc",
            "The pool's engines' mean KV cache usage (vLLM kv_cache_usage_perc)",
            labels=["model", "pool"],
        )
        waiting: dict[tuple[str, str], float] = defaultdict(float)
        usage: dict[tuple[str, str], list[float]] = defaultdict(list)
        for worker in self._registry.workers():
            usage[worker.registration.model, worker.role.value].append(
                worker.load.kv_cache_usage_perc
            )
            held.add_metric([worker.worker_id], index.blocks_held(worker.worker_id))
            if worker.load.prefix_cache_queries:
                ratio = worker.load.prefix_cache_hits / worker.load.prefix_cache_queries
                observed.add_metric([worker.worker_id, "observed"], ratio)
            waiting[worker.registration.model, worker.role.value] += (
                worker.load.num_requests_waiting
            )
        for (model, pool), value in waiting.items():
            depth.add_metric([model, pool], value)
        for (model, pool), values in usage.items():
            kv.add_metric([model, pool], sum(values) / len(values))
        events = CounterMetricFamily(
            "pdserve_kv_event_batches",
            "KV event batches received, and gaps/restarts detected, per worker",
            labels=["worker", "kind"],
        )
        for (worker_id, kind), count in self._stats.snapshot().kv_event_batches.items():
            events.add_metric([worker_id, kind], count)
        yield from (size, held, observed, depth, kv, events)


def process_gauge_publisher(
    metrics: RouterMetrics,
    *,
    registry: WorkerRegistry,
    load: InFlightLoad,
    stats: RoutingStats,
    queues: Callable[[], Mapping[str, PrefillQueue]],
    accounting: FleetAccounting,
    backend_up: Callable[[], bool],
    engines: EngineClient,
    predictor: TTFTPredictor,
) -> Callable[[], None]:
    """Set this process's gauges from its own state (a closure for ``on_publish``)."""
    publish_fits = _fit_publisher(metrics, registry, predictor)

    def publish() -> None:
        inflight = load.snapshot()
        queued: dict[tuple[str, str], float] = defaultdict(float)
        for worker in registry.workers():
            here = inflight.get(worker.worker_id)
            metrics.inflight.labels(worker.worker_id).set(here.requests if here else 0)
            queued[worker.registration.model, worker.role.value] += here.tokens if here else 0
        for (model, pool), tokens in queued.items():
            metrics.queued_prefill.labels(model, pool).set(tokens)
        for model, queue in queues().items():
            metrics.queue_admitted.labels(model).set(queue.admitted_tokens)
            metrics.queue_limit.labels(model).set(queue.limit_tokens)
            metrics.queue_waiting.labels(model).set(queue.waiting)
            metrics.queue_waiting_tokens.labels(model).set(queue.waiting_tokens)
        routing = stats.snapshot()
        for role in WorkerRole:
            workers = sum(1 for w in registry.workers() if w.role is role)
            factor = routing.hotspot_factor(role, workers)
            if factor is not None:
                metrics.hotspot.labels(role.value).set(factor)
        tokens = metrics.tokens_window
        for model, direction in tokens.window_keys():
            metrics.window_tokens.labels(model, direction).set(tokens.total((model, direction)))
        for key in accounting.pools():
            metrics.window_cost.labels(key.model, key.pool).set(accounting.window_cost_usd(key))
        metrics.window_span.set(tokens.span_s())
        metrics.state_up.set(1.0 if backend_up() else 0.0)
        metrics.engine_connections.labels("open").set(engines.open_connections)
        metrics.engine_connections.labels("idle").set(engines.idle_connections)
        publish_fits()

    return publish


_FIT_COEFFICIENTS = {
    "prefill": ("prefill_intercept_seconds", "prefill_seconds_per_token",
                "prefill_seconds_per_token_per_ktoken"),
    "handoff": ("handoff_intercept_seconds", "handoff_seconds_per_request",
                "handoff_seconds_per_token"),
}  # fmt: skip


def _fit_publisher(
    metrics: RouterMetrics, registry: WorkerRegistry, predictor: TTFTPredictor
) -> Callable[[], None]:
    """The predictor's measured speeds of registered workers; a gone worker's series go."""
    shown: dict[str, set[tuple[str, str, str]]] = {}

    def publish() -> None:
        fits = predictor.fits()
        now: dict[str, set[tuple[str, str, str]]] = {}
        for worker in registry.workers():
            fit = fits.get(worker.worker_id)
            if fit is None:
                continue
            values = {"drain_tokens_per_second": fit.drain_tokens_per_s}
            for part in ("prefill", "handoff"):
                terms = getattr(fit, part)
                values.update(zip(_FIT_COEFFICIENTS[part], terms or (None,) * 3, strict=True))
            labels = now[worker.worker_id] = set()
            for coefficient, value in values.items():
                if value is not None:
                    key = (worker.registration.model, worker.worker_id, coefficient)
                    metrics.ttft_fit.labels(*key).set(value)
                    labels.add(key)
        for worker_id, keys in shown.items():
            for key in keys - now.get(worker_id, set()):
                with contextlib.suppress(KeyError):
                    metrics.ttft_fit.remove(*key)
        shown.clear()
        shown.update(now)

    return publish


def _samples(families: list[Metric], name: str) -> dict[Labels, float]:
    """Values of the samples named ``name``, by their labels."""
    return {
        frozenset(sample.labels.items()): sample.value
        for family in families
        for sample in family.samples
        if sample.name == name
    }


def _by(samples: Mapping[Labels, float], *keys: str) -> dict[tuple[str, ...], float]:
    grouped: dict[tuple[str, ...], float] = defaultdict(float)
    for labels, value in samples.items():
        named = dict(labels)
        grouped[tuple(named.get(k, "") for k in keys)] += value
    return grouped


def derived(families: list[Metric]) -> Iterable[GaugeMetricFamily]:
    """Ratios of summed series: the same answer from one router process or several."""
    yield from _hit_ratios(families)
    yield from _window_rates(families)


def _hit_ratios(families: list[Metric]) -> Iterable[GaugeMetricFamily]:
    pool = GaugeMetricFamily(
        "pdserve_pool_prefix_hit_ratio",
        "Prompt tokens not computed: own prefix-cache hits plus (decode) pulled KV, over the "
        "tokens looked up, since the router started",
        labels=["model", "pool"],
    )
    queries = _by(_samples(families, "pdserve_pool_prefix_cache_queries_total"), "model", "pool")
    hits = _by(_samples(families, "pdserve_pool_prefix_cache_hits_total"), "model", "pool")
    pulled = _by(_samples(families, "pdserve_pool_external_prefix_cache_hits_total"),
                 "model", "pool")  # fmt: skip
    for key, asked in queries.items():
        if asked:
            pool.add_metric(list(key), min(1.0, (hits[key] + pulled[key]) / asked))
    predicted = GaugeMetricFamily(
        "pdserve_prefix_hit_ratio",
        "Prompt tokens found cached: predicted by the router at routing time",
        labels=["worker", "source"],
    )
    routed = _by(_samples(families, "pdserve_routed_prompt_tokens_total"), "worker")
    found = _by(_samples(families, "pdserve_routed_predicted_hit_tokens_total"), "worker")
    for (worker,), tokens in routed.items():
        if tokens:
            predicted.add_metric([worker, "predicted"], found[(worker,)] / tokens)
    yield from (pool, predicted)


def _window_rates(families: list[Metric]) -> Iterable[GaugeMetricFamily]:
    span_s = max(1.0, sum(_samples(families, "pdserve_window_span_seconds").values()))
    tokens = _by(_samples(families, "pdserve_window_tokens"), "model", "direction")
    costs = _by(_samples(families, "pdserve_window_cost_usd"), "model", "pool")
    rate = GaugeMetricFamily(
        "pdserve_tokens_per_second",
        "Tokens answered per second over metrics_window_s",
        labels=["model", "direction"],
    )
    for (model, direction), count in tokens.items():
        rate.add_metric([model, direction], count / span_s)
    per_million = GaugeMetricFamily(
        "pdserve_cost_usd_per_million_tokens",
        "Over metrics_window_s: the pool's cost (pool=all: every pool of the model) per "
        "million tokens answered in that direction",
        labels=["model", "pool", "direction"],
    )
    for (model, pool, direction), usd in usd_per_million_tokens(tokens, costs).items():
        per_million.add_metric([model, pool, direction], usd)
    yield from (rate, per_million)


def usd_per_million_tokens(
    tokens: Mapping[tuple[str, ...], float], costs: Mapping[tuple[str, ...], float]
) -> dict[tuple[str, str, str], float]:
    """(model, pool, direction) -> the pool's window cost per million window tokens in that
    direction; pool "all" is every pool of the model. No tokens: no figure."""
    by_model: dict[str, dict[str, float]] = defaultdict(dict)
    for (model, pool), usd in costs.items():
        by_model[model][pool] = usd
    prices = {}
    for model, pools in by_model.items():
        pools = {**pools, "all": sum(pools.values())}
        for direction in DIRECTIONS:
            count = tokens.get((model, direction), 0.0)
            if count > 0:
                prices.update(
                    {(model, p, direction): usd / count * 1e6 for p, usd in pools.items()}
                )
    return prices


def window_view(families: list[Metric]) -> dict[str, dict[tuple[str, ...], float]]:
    """The derived gauges of one scrape, by name and labels (for the status view)."""
    view: dict[str, dict[tuple[str, ...], float]] = {}
    for family in derived(families):
        view[family.name] = {
            tuple(sample.labels.values()): sample.value for sample in family.samples
        }
    return view
