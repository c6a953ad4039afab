"""What ``GET /admin/v1/status`` answers and ``pdserve status`` draws: the factory at a
glance, per model. Rates and percentiles cover the router's ``metrics_window_s``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from contracts.plans import FleetPlan


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class WorkerStatus(_Frozen):
    worker_id: str
    role: str
    state: str  # starting, ready, draining, re-roling, down
    kind: str  # the cost model's worker kind
    inflight_requests: int
    engine_running: float
    engine_waiting: float
    kv_cache_usage_perc: float
    engine_memory_bytes: float
    version: str | None = None  # the registered version it serves, if any


class ModelStatus(_Frozen):
    model: str
    workers_by_role: dict[str, int]
    queue_waiting_requests: int  # in the router's admission queue
    queued_prefill_tokens: int  # sent to prefill, not yet prefilled
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_samples: int
    input_tokens_per_s: float
    output_tokens_per_s: float
    usd_per_million_input_tokens: float | None  # every pool of the model
    usd_per_million_output_tokens: float | None
    workers: list[WorkerStatus]
    route: str | None = None  # "prod v1 · canary v2 10% · shadow v3 5%"; None: no route
    # A P/D model served by one pool alone (serve_degraded): "decode" or "prefill".
    degraded: str | None = None
    # An embedding model's requests, arrival to the whole answer (no first token).
    embedding_latency_p50_s: float | None = None
    embedding_latency_p99_s: float | None = None
    embedding_samples: int = 0

    @property
    def embeds(self) -> bool:
        """Served by embedding workers alone (``/v1/embeddings``)."""
        return set(self.workers_by_role) == {"embed"}


class StatusSnapshot(_Frozen):
    window_s: float
    taken_at_unix_s: float
    models: list[ModelStatus]
    # The newest batches (at most 100) by status: "in_progress" -> 2, "completed" -> 9.
    batches: dict[str, int] = {}
    # The SLO planner's latest plan per model, where a planner runs (`pdserve planner`).
    plans: dict[str, FleetPlan] = {}
