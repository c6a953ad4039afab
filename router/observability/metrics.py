"""The router's Prometheus metrics, in a registry of their own per app.

Labels and their bound (no label ever holds a request, prompt, tenant key or version):
- ``model``: served models and aliases (registered workers' models, at most
  ``max_workers``), or ``unknown`` for a 404;
- ``pool`` / ``role``: prefill, decode, colocated, embed; ``mode``: disaggregated, colocated,
  decode_local; ``stage``: queue, prefill, kv_handoff, decode; ``direction``: input,
  output; ``tenant_class``: interactive, standard, batch;
- ``worker``: registered workers (at most ``max_workers``; a forgotten worker's series
  go with it); ``kind``: worker kinds the agents report (cpu, accelerator names);
- ``route_stage``: prod, canary, shadow (the model's route; never the version itself);
- ``pieces``: how many pieces an embedding request was cut into (at most the workers);
- ``reason``, ``status``, ``endpoint``, ``kind`` of failures, ``outcome``, ``action``:
  fixed sets in the code.
So a histogram has at most models x 3 x 3 x 3 series, and per-worker gauges one per worker.

Several router processes (``router_processes``) aggregate through prometheus-client's
multiprocess mode: counters and histograms add up over the processes; what each process
holds alone (its in-flight load, admission queue, windows) is published as gauges that
add up (``metric_views.process_gauge_publisher``, at each scrape and every second); what
every process sees alike (the registry, the prefix index) is read by the process serving
the scrape; and ratios (hit rates, tokens/s, $/1M tokens) are computed from the summed series at
scrape time (``metric_views.derived``), so they are right for one process or many.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, get_args

import psutil
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from contracts.batch import BatchStatus
from router.observability.arrival_clumps import ArrivalClumps
from router.observability.fleet_accounting import ENGINE_COUNTERS, PoolKey
from router.observability.windows import RecentSamples, SlidingSums
from router.orchestration.usage import Usage
from router.rollout.rollout_gate import StageWindows

if TYPE_CHECKING:
    from router.batch.book import BatchProgress

# Milliseconds to minutes: a cached short prompt on a GPU to a long context queued on CPU.
_LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
    81.92, 163.84, 327.68,
)  # fmt: skip
_FAST_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30)
# Tokens per request, for the planner's length distribution (powers of two).
_PROMPT_TOKEN_BUCKETS = tuple(float(2**k) for k in range(4, 18))
_OUTPUT_TOKEN_BUCKETS = tuple(float(2**k) for k in range(0, 15))
_CLUMP_BUCKETS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0, 128.0)
_ITL_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
)  # fmt: skip


_ENGINE_COUNTER_DOCS = {
    "prefix_cache_queries": ("pdserve_pool_prefix_cache_queries",
                             "Prompt tokens the pool's engines looked up in their prefix cache"),
    "prefix_cache_hits": ("pdserve_pool_prefix_cache_hits",
                          "Prompt tokens found in the pool's own prefix caches"),
    "external_prefix_cache_queries": ("pdserve_pool_external_prefix_cache_queries",
                                      "Prompt tokens the pool asked its KV connector for"),
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
assert set(_ENGINE_COUNTER_DOCS) == set(ENGINE_COUNTERS)


def multiprocess_dir() -> str | None:
    """Set (by ``pdserve router --processes N``) when several processes share the port."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class RouterMetrics:
    def __init__(
        self,
        *,
        window_s: float,
        recent_ttft_samples: int,
        clock: Callable[[], float],
        stage_samples: int = 20_000,
        arrival_clump_window_s: float = 0.001,
    ) -> None:
        self.prometheus = CollectorRegistry(auto_describe=True)
        r = self.prometheus
        self.requests = Counter(
            "pdserve_requests", "Requests by outcome",
            ["model", "endpoint", "status", "route_stage"], registry=r,
        )  # fmt: skip
        # The canary gate's figures per route stage (this process's).
        self.stages = StageWindows(max_samples=stage_samples, clock=clock)
        self.tokens_window = SlidingSums(window_s=window_s, bucket_s=1.0, clock=clock)
        self.recent_ttft = RecentSamples(
            window_s=window_s, max_samples=recent_ttft_samples, clock=clock
        )
        self.recent_embedding_latency = RecentSamples(
            window_s=window_s, max_samples=recent_ttft_samples, clock=clock
        )
        self._clumps = ArrivalClumps(window_s=arrival_clump_window_s)
        self._declare_latencies(r)
        self._declare_counters(r)
        self._declare_rollout(r)
        self._declare_admission(r)
        self._declare_process_health(r)
        self._declare_fleet(r)
        self._declare_process_gauges(r)
        self._declare_worker_gauges(r)
        self._declare_embeddings(r)
        self._declare_batches(r)
        self._shared: list[Collector] = []  # views of state every process holds alike
        self._publishers: list[Callable[[], None]] = []
        self._derive: Callable[[list[Metric]], Iterable[Metric]] = lambda _: ()

    # -- wiring ----------------------------------------------------------------

    def share(self, collector: Collector) -> None:
        """A scrape-time view of state every router process holds alike (the registry)."""
        self._shared.append(collector)

    def on_publish(self, publish: Callable[[], None]) -> None:
        """Set process-local gauges; run before each scrape and every second."""
        self._publishers.append(publish)

    def derive_with(self, derive: Callable[[list[Metric]], Iterable[Metric]]) -> None:
        """Compute ratio gauges from the (summed) series at scrape time."""
        self._derive = derive

    def publish(self) -> None:
        for publish in self._publishers:
            publish()

    # -- exposition ------------------------------------------------------------

    def families(self) -> list[Metric]:
        """Every series, summed over the router's processes when there are several."""
        self.publish()
        directory = multiprocess_dir()
        if directory is None:
            base = list(self.prometheus.collect())
        else:
            _forget_dead_processes(directory)
            merged = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(merged, path=directory)
            base = list(merged.collect())
        for collector in self._shared:
            base.extend(collector.collect())
        return [*base, *self._derive(base)]

    def exposition(self) -> bytes:
        families = self.families()

        class _Snapshot:
            @staticmethod
            def collect() -> list[Metric]:
                return families

        return generate_latest(_Snapshot())  # type: ignore[arg-type]

    # -- recording -------------------------------------------------------------

    def observe_ttft(
        self, model: str, mode: str, tenant_class: str, seconds: float, stage: str = "prod"
    ) -> None:
        self.ttft.labels(model, mode, tenant_class, stage).observe(seconds)
        self.stages.ttft(model, stage, seconds)
        if stage != "shadow":  # the status view's TTFT is what clients see
            self.recent_ttft.add(model, seconds)

    def observe_embedding(
        self, model: str, tenant_class: str, seconds: float, stage: str = "prod"
    ) -> None:
        """An answered ``/v1/embeddings`` request: arrival to the whole answer. For a
        canary's gate, that answer is its first byte too, as a whole completion's is."""
        self.e2e.labels(model, "embed", tenant_class, stage).observe(seconds)
        self.stages.ttft(model, stage, seconds)
        self.stages.answered(model, stage, error=False)
        if stage != "shadow":
            self.recent_embedding_latency.add(model, seconds)

    def itl_observer(self, model: str, stage: str) -> Callable[[float], None]:
        """What a stream calls for each gap between events."""
        histogram = self.itl.labels(model, stage).observe
        windows = self.stages

        def observe(seconds: float) -> None:
            histogram(seconds)
            windows.itl(model, stage, seconds)

        return observe

    def observe_arrival(self, model: str, tenant_class: str, at_s: float) -> None:
        """A request past validation; a batch line is not one the planner plans a SLO for
        (it reads the batches' backlog instead)."""
        if tenant_class == "batch":
            return
        self.arrivals.labels(model).inc()
        closed = self._clumps.arrive(model, at_s)
        if closed is not None:
            self.arrival_clumps.labels(model).observe(closed)

    def observe_usage(
        self, model: str, tenant_class: str, usage: Usage, *, counts_prompt: bool = True
    ) -> None:
        """Count an answer's tokens; a later choice of a fan-out shares its prompt."""
        prompt = usage.prompt_tokens if counts_prompt else 0
        self.prompt_tokens.labels(model, tenant_class).inc(prompt)
        if tenant_class != "batch":  # the planner's lengths: what it plans a SLO for
            self.request_prompt_tokens.labels(model).observe(usage.prompt_tokens)
            self.request_output_tokens.labels(model).observe(usage.completion_tokens)
        self.generation_tokens.labels(model, tenant_class).inc(usage.completion_tokens)
        self.tokens_window.add((model, "input"), prompt)
        self.tokens_window.add((model, "output"), usage.completion_tokens)

    def count_routed(self, worker_id: str, role: str, prompt_tokens: int | None,
                     uncached_tokens: int) -> None:  # fmt: skip
        self.routed_requests.labels(worker_id, role).inc()
        if prompt_tokens is not None:
            self.routed_prompt_tokens.labels(worker_id).inc(prompt_tokens)
            self.routed_hit_tokens.labels(worker_id).inc(max(0, prompt_tokens - uncached_tokens))

    def count_worker_time(self, key: PoolKey, kind: str, seconds: float, usd: float) -> None:
        self.worker_seconds.labels(key.model, key.pool, kind).inc(seconds)
        self.cost_usd.labels(key.model, key.pool).inc(usd)

    def count_engine(self, key: PoolKey, field: str, delta: float) -> None:
        self.engine[field].labels(key.model, key.pool).inc(delta)

    def forget_worker(self, worker_id: str) -> None:
        """Drop a gone worker's own series (in multiprocess mode its files keep them at
        their last value until the router restarts: bounded by the workers it saw)."""
        for metric in (self.routed_prompt_tokens, self.routed_hit_tokens, self.inflight,
                       self.circuit_open, self.circuit_trips):  # fmt: skip
            _remove(metric, worker_id)
        for role in ("prefill", "decode", "colocated"):
            _remove(self.routed_requests, worker_id, role)

    def _declare_latencies(self, r: CollectorRegistry) -> None:
        self.ttft = Histogram(
            "pdserve_time_to_first_token_seconds",
            "Arrival to first streamed byte, or to the whole answer when not streamed",
            ["model", "mode", "tenant_class", "route_stage"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "pdserve_e2e_request_latency_seconds",
            "Arrival to last byte",
            ["model", "mode", "tenant_class", "route_stage"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.arrivals = Counter(
            "pdserve_arrivals", "Requests of a model that arrived to be answered within its "
            "SLOs (every class but batch; every outcome past validation): the planner's rate",
            ["model"], registry=r,
        )  # fmt: skip
        self.arrival_clumps = Histogram(
            "pdserve_arrival_clump_size", "Sizes of the clumps those arrivals came in (each "
            "within arrival_clump_window_s of the previous, per router process)",
            ["model"], buckets=_CLUMP_BUCKETS, registry=r,
        )  # fmt: skip
        self.request_prompt_tokens = Histogram(
            "pdserve_request_prompt_tokens", "Prompt tokens per answered request (the planner's "
            "length distribution)", ["model"], buckets=_PROMPT_TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.request_output_tokens = Histogram(
            "pdserve_request_output_tokens", "Output tokens per answered request (the planner's "
            "length distribution)", ["model"], buckets=_OUTPUT_TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
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
            ["model", "route_stage"],
            buckets=_ITL_BUCKETS_S,
            registry=r,
        )

    def _declare_rollout(self, r: CollectorRegistry) -> None:
        self.shadow_requests = Counter(
            "pdserve_shadow_requests",
            "Mirrored requests to a route's shadow version by outcome: ok, error, timeout, "
            "shed (not sent: under load), mismatch (a greedy answer differing from prod's)",
            ["model", "outcome"],
            registry=r,
        )
        self.safety_hits = Counter(
            "pdserve_safety_hits",
            "Safety policy hits by direction (input, output) and action (block, flag)",
            ["model", "direction", "action"],
            registry=r,
        )
        self.canary_rollbacks = Counter(
            "pdserve_canary_rollbacks",
            "Canaries rolled back by their SLO gate (not by an operator)",
            ["model"],
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

    def _declare_process_health(self, r: CollectorRegistry) -> None:
        self.event_loop_lag = Histogram(
            "pdserve_event_loop_lag_seconds",
            "How late the router's event loop woke a timer (a probe every 0.1 s): time every "
            "request waited behind whatever held the loop",
            buckets=_FAST_BUCKETS_S,
            registry=r,
        )
        self.gc_pause = Histogram(
            "pdserve_gc_pause_seconds",
            "Python garbage collections in the router process, by generation: the loop "
            "stands still for each",
            ["generation"],
            buckets=_FAST_BUCKETS_S,
            registry=r,
        )

    def _declare_admission(self, r: CollectorRegistry) -> None:
        self.admission_rejections = Counter(
            "pdserve_admission_rejections",
            "Requests refused by admission, by reason (rate_limit_rpm, rate_limit_tpm, "
            "ttft_slo_unattainable, prompt_needs_idle_pool, prompt_exceeds_ttft_slo, "
            "queue_deadline, queue_full, decode_kv_full, decode_thrashing)",
            ["model", "reason"],
            registry=r,
        )
        self.rejection_latency = Histogram(
            "pdserve_admission_rejection_seconds",
            "Arrival to the 429 for requests admission refused (queue waits included), by "
            "how much of the prompt was tokenized first (measured: none, head, whole)",
            ["model", "reason", "measured"],
            buckets=_FAST_BUCKETS_S,
            registry=r,
        )
        self.head_rest_share = Gauge(
            "pdserve_head_bound_rest_share",
            "Of a long prompt's head's tokens per character, what admission assumes its unread "
            "rest has at least (learned from prompts measured both ways; 0.8 until then)",
            ["model"],
            registry=r,
        )
        self.tokenize_cpu = Summary(
            "pdserve_tokenize_cpu_seconds",
            "CPU seconds the router spent tokenizing each measured prompt (the tokenizing "
            "thread's own time): with process CPU per request, what the rest costs",
            ["model"],
            registry=r,
        )
        self.prompt_chars = Counter(
            "pdserve_prompt_chars_total",
            "Characters of prompt text the router tokenized (source=tokenized) or took from "
            "its token prefix cache (source=reused)",
            ["model", "source"],
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

    def _declare_fleet(self, r: CollectorRegistry) -> None:
        self.worker_seconds = Counter(
            "pdserve_worker_seconds", "Seconds workers were registered, by kind",
            ["model", "pool", "kind"], registry=r,
        )  # fmt: skip
        self.cost_usd = Counter(
            "pdserve_cost_usd", "Worker cost at the cost model's $/hour", ["model", "pool"],
            registry=r,
        )  # fmt: skip
        self.engine = {
            field: Counter(name, doc, ["model", "pool"], registry=r)
            for field, (name, doc) in _ENGINE_COUNTER_DOCS.items()
        }
        self.stream_migrations = Counter(
            "pdserve_stream_migrations",
            "Streams whose engine failed mid-answer, by outcome: migrated (went on on another "
            "worker), not_continuable (its sampling cannot be continued exactly), no_worker",
            ["model", "outcome"], registry=r,
        )  # fmt: skip
        self.degraded_requests = Counter(
            "pdserve_degraded_requests",
            "Requests of a P/D model served whole by the one pool left (serve_degraded), "
            "by that pool: decode (no ready prefill worker) or prefill (no ready decode)",
            ["model", "pool"], registry=r,
        )  # fmt: skip
        self.circuit_trips = Counter(
            "pdserve_worker_circuit_trips",
            "Times a worker's circuit breaker opened (circuit_failures_to_open failed requests "
            "in a row, an unreachable engine, or a failed trial)", ["worker"], registry=r,
        )  # fmt: skip
        self.kv_releases = Counter(
            "pdserve_kv_releases",
            "KV handoffs no decode would pull, sent to a live decode to be refused so that "
            "the producer frees the blocks now, not at the lease's end, by outcome: released, "
            "failed, no_consumer (no other decode), skipped (too many in flight)",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.stall_checks = Counter(
            "pdserve_stall_checks",
            "Engines probed at once because a stream on them went silent "
            "(stall_check_after_s), by outcome: alive (it answered /health: slow, not hung) "
            "or hung (stall_check_failures probes failed: ejected, its streams failed over)",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.routed_requests = Counter(
            "pdserve_routed_requests", "Requests sent to each worker (retries included)",
            ["worker", "role"], registry=r,
        )  # fmt: skip
        self.routed_prompt_tokens = Counter(
            "pdserve_routed_prompt_tokens", "Prompt tokens of the requests routed to a worker",
            ["worker"], registry=r,
        )  # fmt: skip
        self.routed_hit_tokens = Counter(
            "pdserve_routed_predicted_hit_tokens",
            "Of those, the tokens the router predicted cached there", ["worker"], registry=r,
        )  # fmt: skip

    def _declare_batches(self, r: CollectorRegistry) -> None:
        self.batch_lines = Counter(
            "pdserve_batch_lines",
            "Batch lines answered and kept, by outcome: succeeded (2xx) or failed (the "
            "error file); a line waiting for room (429, 503) is not counted until answered",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.batches_at_risk = Counter(
            "pdserve_batches_at_risk",
            "Batches found at risk of expiring (at their pace so far they would end past "
            "their completion window); each is counted once, and given more lines in flight",
            registry=r,
        )  # fmt: skip
        self.batches_ended = Counter(
            "pdserve_batches_ended",
            "Batches that ended on this router, by status: completed, failed (validation), "
            "cancelled, expired",
            ["status"], registry=r,
        )  # fmt: skip
        self.batches = _process_gauge(
            r, "pdserve_batches",
            "Batches kept in the control state, by status (every replica sharing the state "
            "reports the same count: take the max, not the sum)", ["status"], "livemax",
        )  # fmt: skip
        self.batch_prefills_taken_back = Counter(
            "pdserve_batch_prefills_taken_back",
            "Batch lines' prefills cancelled at a worker because a prompt that does not "
            "yield was sent there (each line goes again later; its full blocks stay cached)",
            ["model"], registry=r,
        )  # fmt: skip
        self._declare_batch_progress(r)

    def _declare_batch_progress(self, r: CollectorRegistry) -> None:
        # Of each batch this router runs now; a batch's series go when its run here ends.
        self.batch_lines_per_s = _process_gauge(
            r, "pdserve_batch_lines_per_second",
            "A running batch's lines answered per second, over the last minute", ["batch"],
        )  # fmt: skip
        self.batch_backlog_tokens = _process_gauge(
            r, "pdserve_batch_backlog_tokens",
            "A running batch's lines not yet answered, in tokens: prompt (estimated, 4 "
            "characters a token) and max_tokens", ["batch"],
        )  # fmt: skip
        self.batch_deadline_s = _process_gauge(
            r, "pdserve_batch_seconds_to_deadline",
            "Seconds until a running batch's completion window ends", ["batch"], "livemax",
        )  # fmt: skip
        self.batch_in_flight = _process_gauge(
            r, "pdserve_batch_lines_in_flight",
            "A running batch's lines in flight (running), and how many its pacing allows "
            "now (limit)", ["batch", "kind"],
        )  # fmt: skip
        # By model, over the batches this router runs now: what the SLO planner plans for.
        self.batch_pending_lines = _process_gauge(
            r, "pdserve_batch_pending_lines",
            "Lines of running batches not yet answered, by the model they ask for", ["model"],
        )  # fmt: skip
        self.batch_pending_tokens = _process_gauge(
            r, "pdserve_batch_pending_tokens",
            "Their tokens: input (prompts, estimated at 4 characters a token) and output "
            "(max_tokens)", ["model", "direction"],
        )  # fmt: skip
        self.batch_due_lines_per_s = _process_gauge(
            r, "pdserve_batch_due_lines_per_second",
            "The pace their deadlines need: each running batch's lines left over its seconds "
            "left, summed", ["model"],
        )  # fmt: skip
        self._batch_pending: dict[str, BatchProgress] = {}  # batch id -> its last progress

    # The batch runner's meters (``router.batch.runner.BatchMeters``).
    def batch_line(self, outcome: str) -> None:
        self.batch_lines.labels(outcome).inc()

    def batch_ended(self, status: str) -> None:
        self.batches_ended.labels(status).inc()

    def batch_at_risk(self) -> None:
        self.batches_at_risk.inc()

    def batch_statuses(self, counts: Mapping[str, int]) -> None:
        # Every status set, absent ones to 0: a multiprocess gauge keeps what it was last set
        # to, so none may be left out.
        for status in get_args(BatchStatus):
            self.batches.labels(status).set(counts.get(status, 0))

    def batch_progress(self, batch_id: str, progress: BatchProgress | None) -> None:
        """A running batch's progress; None when its run here ends (its series go)."""
        gauges = (self.batch_lines_per_s, self.batch_backlog_tokens, self.batch_deadline_s)
        self._show_pending(batch_id, progress)
        if progress is None:
            for gauge in gauges:
                _remove(gauge, batch_id)
            for kind in ("running", "limit"):
                _remove(self.batch_in_flight, batch_id, kind)
            return
        self.batch_lines_per_s.labels(batch_id).set(progress.lines_per_s)
        self.batch_backlog_tokens.labels(batch_id).set(progress.backlog_tokens)
        if progress.seconds_left is not None:
            self.batch_deadline_s.labels(batch_id).set(progress.seconds_left)
        self.batch_in_flight.labels(batch_id, "running").set(progress.in_flight)
        self.batch_in_flight.labels(batch_id, "limit").set(progress.pace_limit)

    def _show_pending(self, batch_id: str, progress: BatchProgress | None) -> None:
        before = {m for p in self._batch_pending.values() for m in p.pending}
        if progress is None:
            self._batch_pending.pop(batch_id, None)
        else:
            self._batch_pending[batch_id] = progress
        lines: dict[str, float] = defaultdict(float)
        tokens: dict[tuple[str, str], float] = defaultdict(float)
        due: dict[str, float] = defaultdict(float)
        for shown in self._batch_pending.values():
            for model, part in shown.pending.items():
                lines[model] += part.lines
                tokens[model, "input"] += part.prompt_tokens
                tokens[model, "output"] += part.output_tokens
                if shown.seconds_left is not None:
                    due[model] += part.lines / max(1.0, shown.seconds_left)
        for model in before - set(lines):
            _remove(self.batch_pending_lines, model)
            _remove(self.batch_due_lines_per_s, model)
            for direction in ("input", "output"):
                _remove(self.batch_pending_tokens, model, direction)
        for model, count in lines.items():
            self.batch_pending_lines.labels(model).set(count)
            self.batch_due_lines_per_s.labels(model).set(due[model])
        for (model, direction), count in tokens.items():
            self.batch_pending_tokens.labels(model, direction).set(count)

    def _declare_embeddings(self, r: CollectorRegistry) -> None:
        self.embedding_splits = Counter(
            "pdserve_embedding_splits",
            "Embedding requests cut into pieces across idle embedding workers "
            "(embedding_split_min_inputs), by model and the number of pieces", ["model", "pieces"],
            registry=r,
        )  # fmt: skip

    def _declare_worker_gauges(self, r: CollectorRegistry) -> None:
        """The router's view of each worker, per process."""
        self.inflight = _process_gauge(
            r, "pdserve_worker_inflight_requests", "Requests the router has in flight on a worker",
            ["worker"],
        )  # fmt: skip
        self.circuit_open = _process_gauge(
            r, "pdserve_worker_circuit_open",
            "1 while a worker's circuit breaker is open or half-open (its failed requests took "
            "it out of rotation and no trial has succeeded since), else 0; processes: the max",
            ["worker"], "livemax",
        )  # fmt: skip
        self.ttft_fit = _process_gauge(
            r, "pdserve_ttft_predictor_fit",
            "The TTFT predictor's measured speeds per worker (for the SLO planner), by "
            "coefficient: prefill alone (prefill_intercept_seconds, prefill_seconds_per_token, "
            "prefill_seconds_per_token_per_ktoken: the square term), drain_tokens_per_second "
            "(through a queue), and prefill end to first token (handoff_intercept_seconds, "
            "handoff_seconds_per_request in flight there, handoff_seconds_per_token pulled); "
            "processes: the most recently set", ["model", "worker", "coefficient"],
            "livemostrecent",
        )  # fmt: skip

    def _declare_process_gauges(self, r: CollectorRegistry) -> None:
        """What each process holds alone; several processes' values add up (or max)."""
        gauge = functools.partial(_process_gauge, r)

        self.window_tokens = gauge(
            "pdserve_window_tokens", "Tokens answered over metrics_window_s", ["model", "direction"]
        )
        self.window_cost = gauge(
            "pdserve_window_cost_usd",
            "Worker cost accrued over metrics_window_s",
            ["model", "pool"],
        )
        self.window_span = gauge("pdserve_window_span_seconds", "Seconds the windows cover "
                                 "(less than metrics_window_s while the router is young)", [],
                                 "livemax")  # fmt: skip
        self.queued_prefill = gauge(
            "pdserve_pool_queued_prefill_tokens",
            "Uncached prompt tokens the router has sent to the pool and not yet seen prefilled",
            ["model", "pool"],
        )
        self.queue_admitted = gauge("pdserve_prefill_queue_admitted_tokens",
                                    "Uncached prompt tokens admitted and not yet prefilled",
                                    ["model"])  # fmt: skip
        self.queue_limit = gauge(
            "pdserve_prefill_queue_limit_tokens",
            "The prefill queue's bound (per process: they add up)",
            ["model"],
        )
        self.queue_waiting = gauge(
            "pdserve_prefill_queue_waiting_requests", "Requests waiting in the router", ["model"]
        )
        self.queue_waiting_tokens = gauge(
            "pdserve_prefill_queue_waiting_tokens",
            "Uncached tokens waiting in the router",
            ["model"],
        )
        self.hotspot = gauge(
            "pdserve_hotspot_factor",
            "Workers x the largest share of the recent routing decisions in a pool (1 = even; "
            "the worst router process)", ["pool"], "livemax",
        )  # fmt: skip
        self.engine_connections = gauge(
            "pdserve_engine_connections",
            "The router's connections to engines (engine_client): open ones (each holds one "
            "of upstream_pool_size), and of those the idle ones kept for reuse",
            ["state"], "livesum",
        )  # fmt: skip
        self.state_up = gauge(
            "pdserve_state_backend_up",
            "1 while the control state backend answers; 0 while the router serves on its last "
            "view (Redis down)", [], "livemin",
        )  # fmt: skip


def _process_gauge(
    r: CollectorRegistry, name: str, doc: str, labels: list[str], mode: str = "livesum"
) -> Gauge:
    return Gauge(name, doc, labels, registry=r, multiprocess_mode=mode)  # type: ignore[arg-type]


def _remove(metric: Counter | Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)


def _forget_dead_processes(directory: str) -> None:
    """A router process that died (and was restarted) must not count in the live gauges."""
    for path in Path(directory).glob("gauge_live*_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        if not psutil.pid_exists(pid):
            mark_process_dead(pid, directory)
