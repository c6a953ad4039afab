"""The simulator's ``/metrics``: vLLM's metric names, labels and meaning.

Gauges and counters are read from the engine at scrape time; latency histograms
are observed as tokens leave. Each sim has its own registry, so hundreds of sims
share a process without sharing numbers.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sim.engine import SimEngine, SimRequest

_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                      1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
# vLLM's NIXL buckets: transfer seconds, and 2 KiB to 8 GiB in powers of four.
_TRANSFER_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
_TRANSFER_BUCKETS_BYTES = tuple(2 ** (10 + i) for i in range(1, 25, 2))
_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
_REASONS = ("stop", "length", "abort", "error")


class SimMetrics:
    def __init__(self, engine: SimEngine, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ["engine", "model_name"]
        self._labels = ("0", model_name)
        self._arrived_s: dict[str, float] = {}
        self._last_token_s: dict[str, float] = {}

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=_LATENCY_BUCKETS_S, registry=self.registry)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token")
        self.itl = histogram("vllm:inter_token_latency_seconds", "Inter-token latency")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency")
        self.transfer = Histogram(
            "vllm:nixl_xfer_time_seconds", "Simulated KV transfer time", labels,
            buckets=_TRANSFER_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.transfer_bytes = Histogram(
            "vllm:nixl_bytes_transferred", "Simulated bytes per KV transfer", labels,
            buckets=_TRANSFER_BUCKETS_BYTES, registry=self.registry,
        )  # fmt: skip
        self.failed_transfers = Counter(
            "vllm:nixl_num_failed_transfers", "Failed simulated KV transfers", labels,
            registry=self.registry,
        )  # fmt: skip
        self.failed_transfers.labels(*self._labels)  # exported at 0 before any failure
        self.registry.register(_EngineCollector(engine, self._labels))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def on_arrival(self, request: SimRequest) -> None:
        self._arrived_s[request.request_id] = time.monotonic()

    def on_token(self, request: SimRequest, first: bool) -> None:
        now = time.monotonic()
        if first:
            arrived = self._arrived_s.get(request.request_id, now)
            self.ttft.labels(*self._labels).observe(now - arrived)
        else:
            self.itl.labels(*self._labels).observe(
                now - self._last_token_s.get(request.request_id, now)
            )
        self._last_token_s[request.request_id] = now

    def on_transfer(self, seconds: float, num_bytes: int) -> None:
        self.transfer.labels(*self._labels).observe(seconds)
        self.transfer_bytes.labels(*self._labels).observe(num_bytes)

    def on_transfer_failed(self) -> None:
        self.failed_transfers.labels(*self._labels).inc()

    def on_finished(self, request: SimRequest) -> None:
        arrived = self._arrived_s.pop(request.request_id, None)
        self._last_token_s.pop(request.request_id, None)
        if arrived is not None:
            self.e2e.labels(*self._labels).observe(time.monotonic() - arrived)


class _EngineCollector(Collector):
    def __init__(self, engine: SimEngine, labels: tuple[str, str]) -> None:
        self._engine = engine
        self._labels = list(labels)

    def collect(self):
        engine, stats, labels = self._engine, self._engine.stats, self._labels
        names = ["engine", "model_name"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(labels, value)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the batch", len(engine.running))
        yield gauge("vllm:num_requests_waiting", "Requests queued", len(engine.waiting))
        yield gauge("vllm:kv_cache_usage_perc", "KV blocks in use (0-1)", engine.pool.usage)
        yield counter("vllm:prompt_tokens", "Prompt tokens processed",
                      sum(stats.prompt_tokens_by_source.values()))  # fmt: skip
        yield counter("vllm:generation_tokens", "Tokens generated", stats.generation_tokens)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up",
                      stats.prefix_cache_queries)  # fmt: skip
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found cached",
                      stats.prefix_cache_hits)  # fmt: skip
        yield counter("vllm:num_preemptions", "Requests preempted", stats.preemptions)
        # The sim's own: how busy the engine was, which a benchmark reads to tell idle time.
        yield counter("sim:engine_busy_seconds", "Seconds the engine spent in steps",
                      stats.busy_s)  # fmt: skip
        yield counter("vllm:external_prefix_cache_queries", "Prompt tokens asked of the KV "
                      "connector", stats.external_prefix_cache_queries)  # fmt: skip
        yield counter("vllm:external_prefix_cache_hits", "Prompt tokens pulled by the KV "
                      "connector", stats.external_prefix_cache_hits)  # fmt: skip
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from",
            labels=[*names, "source"],
        )  # fmt: skip
        for source in _SOURCES:
            by_source.add_metric([*labels, source], stats.prompt_tokens_by_source[source])
        yield by_source
        success = CounterMetricFamily(
            "vllm:request_success",
            "Finished requests by reason",
            labels=[*names, "finished_reason"],
        )
        for reason in _REASONS:
            success.add_metric([*labels, reason], stats.finished[reason])
        yield success
