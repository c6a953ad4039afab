"""Writes ``pdserve-dashboard.json``, the Grafana dashboard of a pdserve fleet.

Panels are declared here as (title, unit, queries) so the JSON stays regular; run
``python deploy/grafana/build_dashboard.py`` after changing them (a test checks the JSON
is current, and that every metric it names is one a running cluster exports).
Import it in Grafana (Dashboards > Import) and pick the Prometheus data source.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("pdserve-dashboard.json")
M = '{model=~"$model"}'
RATE = "$__rate_interval"


def quantiles(metric: str, by: str, extra: str = "") -> list[tuple[str, str]]:
    selector = f'{{model=~"$model"{extra}}}'
    return [
        (f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{selector}[{RATE}])))",
         f"p{round(q * 100)} {{{{{by}}}}}")
        for q in (0.5, 0.99)
    ]  # fmt: skip


# (row, title, unit, [(expr, legend)])
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("Latency", "TTFT p50 / p99 by mode", "s",
     quantiles("pdserve_time_to_first_token_seconds", "mode")),
    ("Latency", "TTFT p50 / p99 by route stage (prod, canary, shadow)", "s",
     quantiles("pdserve_time_to_first_token_seconds", "route_stage")),
    ("Latency", "ITL p50 / p99, TPOT p99", "s",
     [*quantiles("pdserve_inter_token_latency_seconds", "model"),
      (f"histogram_quantile(0.99, sum by (le, model) "
       f"(rate(pdserve_time_per_output_token_seconds_bucket{M}[{RATE}])))", "TPOT p99 {{model}}")]),
    ("Latency", "Time per stage p50 / p99 (queue, prefill, kv_handoff, decode)", "s",
     quantiles("pdserve_request_stage_seconds", "stage")),
    ("Latency", "End to end p50 / p99 by tenant class", "s",
     quantiles("pdserve_e2e_request_latency_seconds", "tenant_class")),
    ("Throughput", "Tokens per second", "short",
     [(f"sum by (model) (rate(pdserve_prompt_tokens_total{M}[{RATE}]))", "in {{model}}"),
      (f"sum by (model) (rate(pdserve_generation_tokens_total{M}[{RATE}]))", "out {{model}}")]),
    ("Throughput", "Requests per second by status", "reqps",
     [(f"sum by (status) (rate(pdserve_requests_total{M}[{RATE}]))", "{{status}}")]),
    ("Queues", "Queue depth: engines waiting, and the router's admission queue", "short",
     [(f"sum by (model, pool) (pdserve_pool_queue_depth{M})", "engines {{pool}}"),
      (f"sum by (model) (pdserve_prefill_queue_waiting_requests{M})", "router {{model}}")]),
    ("Queues", "Queued uncached prefill tokens", "short",
     [(f"sum by (model, pool) (pdserve_pool_queued_prefill_tokens{M})", "sent {{pool}}"),
      (f"sum by (model) (pdserve_prefill_queue_admitted_tokens{M})", "admitted {{model}}"),
      (f"sum by (model) (pdserve_prefill_queue_limit_tokens{M})", "limit {{model}}")]),
    ("KV and memory", "KV cache usage per worker", "percentunit",
     [("max by (worker) (pdserve_worker_kv_cache_usage_perc)", "{{worker}}")]),
    ("KV and memory", "Engine memory: host RSS and accelerator", "bytes",
     [("sum by (worker) (pdserve_worker_engine_memory_bytes)", "host {{worker}}"),
      ('sum by (worker) (pdserve_worker_accelerator_memory_bytes{kind="used"})',
       "accelerator {{worker}}")]),
    ("KV and memory", "Prefix hit rate per pool (decode: pulled KV counts as a hit)",
     "percentunit",
     [(f"(sum by (pool) (rate(pdserve_pool_prefix_cache_hits_total{M}[{RATE}])) + "
       f"sum by (pool) (rate(pdserve_pool_external_prefix_cache_hits_total{M}[{RATE}]))) / "
       f"sum by (pool) (rate(pdserve_pool_prefix_cache_queries_total{M}[{RATE}]))", "{{pool}}")]),
    ("KV and memory", "KV transfers: rate, MB/s, failures", "short",
     [(f"sum by (model) (rate(pdserve_kv_transfers_total{M}[{RATE}]))", "transfers/s"),
      (f"sum by (model) (rate(pdserve_kv_transfer_bytes_total{M}[{RATE}])) / 1e6", "MB/s"),
      (f"sum by (model) (rate(pdserve_kv_transfer_failures_total{M}[{RATE}]))", "failures/s"),
      (f"sum by (model) (rate(pdserve_kv_transfer_seconds_total{M}[{RATE}])) / "
       f"sum by (model) (rate(pdserve_kv_transfers_total{M}[{RATE}]))", "mean seconds")]),
    ("KV and memory", "Preemptions per second (eviction storms)", "short",
     [(f"sum by (model, pool) (rate(pdserve_pool_preemptions_total{M}[{RATE}]))", "{{pool}}")]),
    ("Rollout", "Canary rollbacks, shadow outcomes, safety hits", "short",
     [(f"sum by (model) (increase(pdserve_canary_rollbacks_total{M}[1h]))",
       "rollbacks 1h {{model}}"),
      (f"sum by (outcome) (rate(pdserve_shadow_requests_total{M}[{RATE}]))", "shadow {{outcome}}"),
      (f"sum by (direction, action) (rate(pdserve_safety_hits_total{M}[{RATE}]))",
       "safety {{direction}} {{action}}")]),
    ("Cost and pools", "$ per 1M tokens (router's window)", "currencyUSD",
     [('pdserve_cost_usd_per_million_tokens{model=~"$model", pool="all"}',
       "{{direction}} {{model}}")]),
    ("Cost and pools", "$ per 1M output tokens over 1h (from the counters)", "currencyUSD",
     [(f"sum by (model) (rate(pdserve_cost_usd_total{M}[1h])) / "
       f"sum by (model) (rate(pdserve_generation_tokens_total{M}[1h])) * 1e6", "{{model}}")]),
    ("Cost and pools", "Workers per model and role (P:D)", "short",
     [('sum by (model, role) (pdserve_workers{model=~"$model", state="ready"})',
       "{{role}} {{model}}"),
      ('sum by (model, role) (pdserve_workers{model=~"$model", state="not_ready"})',
       "not ready {{role}}")]),
    ("Embeddings", "Embedding latency p50 / p99 (arrival to the whole answer)", "s",
     quantiles("pdserve_e2e_request_latency_seconds", "model", ', mode="embed"')),
    ("Embeddings", "Embedding requests/s by status, and requests cut across workers",
     "reqps",
     [(f'sum by (status) (rate(pdserve_requests_total{{model=~"$model", '
       f'endpoint="embeddings"}}[{RATE}]))', "{{status}}"),
      (f"sum by (pieces) (rate(pdserve_embedding_splits_total{M}[{RATE}]))",
       "cut in {{pieces}}")]),
    ("Embeddings", "Embedding input tokens/s and $ per 1M input tokens", "short",
     [(f"sum by (model) (rate(pdserve_prompt_tokens_total{M}[{RATE}])) and on (model) "
       f'(sum by (model) (pdserve_workers{{role="embed"}}) > 0)', "tokens/s {{model}}"),
      ('pdserve_cost_usd_per_million_tokens{model=~"$model", pool="embed", '
       'direction="input"}', "$/1M {{model}}")]),
    ("Batches", "Batches by status (the control state's count, the same on every replica)",
     "short", [("max by (status) (pdserve_batches)", "{{status}}")]),
    ("Batches", "Running batches: lines/s, and lines in flight against the pacer's limit",
     "short",
     [("sum by (batch) (pdserve_batch_lines_per_second)", "lines/s {{batch}}"),
      ("sum by (batch, kind) (pdserve_batch_lines_in_flight)", "{{kind}} {{batch}}")]),
    ("Batches", "Running batches: backlog (tokens) and seconds to the window's end", "short",
     [("sum by (batch) (pdserve_batch_backlog_tokens)", "backlog {{batch}}"),
      ("max by (batch) (pdserve_batch_seconds_to_deadline)", "seconds left {{batch}}")]),
    ("Admission and errors", "Admission rejections by reason", "reqps",
     [(f"sum by (reason) (rate(pdserve_admission_rejections_total{M}[{RATE}]))", "{{reason}}"),
      (f"sum by (reason) (rate(pdserve_limit_rejections_total{M}[{RATE}]))", "{{reason}}")]),
    ("Admission and errors", "TTFT forecast error p50 / p99 (|observed - predicted|)", "s",
     quantiles("pdserve_ttft_prediction_error_seconds", "model")),
    ("Admission and errors", "Prompt text taken from the router's token prefix cache",
     "percentunit",
     [(f'sum by (model) (rate(pdserve_prompt_chars_total{{model=~"$model", source="reused"}}'
       f"[{RATE}])) / sum by (model) (rate(pdserve_prompt_chars_total{M}[{RATE}]))",
       "{{model}}")]),
    ("Admission and errors", "Router event loop lag and GC pauses, p99", "s",
     [(f"histogram_quantile(0.99, sum by (le) (rate(pdserve_event_loop_lag_seconds_bucket"
       f"[{RATE}])))", "loop lag p99"),
      (f"histogram_quantile(0.99, sum by (le, generation) (rate(pdserve_gc_pause_seconds_bucket"
       f"[{RATE}])))", "gc gen {{generation}} p99")]),
    ("Admission and errors", "Upstream failures and stream errors", "short",
     [(f"sum by (role, kind) (rate(pdserve_upstream_failures_total[{RATE}]))",
       "{{role}} {{kind}}"),
      (f"sum by (model) (rate(pdserve_stream_errors_total{M}[{RATE}]))", "stream errors")]),
]  # fmt: skip


TEMPLATE_VARIABLES = [
    {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
    {"name": "model", "type": "query", "label": "model", "includeAll": True, "multi": True,
     "allValue": ".*", "refresh": 2, "datasource": {"type": "prometheus", "uid": "${datasource}"},
     "query": "label_values(pdserve_workers, model)",
     "definition": "label_values(pdserve_workers, model)"},
]  # fmt: skip


def dashboard() -> dict:
    panels: list[dict] = []
    y, row_seen, next_id = 0, None, 1
    column = 0
    for row, title, unit, queries in PANELS:
        if row != row_seen:
            y += 0 if column == 0 else 8
            panels.append(
                {
                    "type": "row",
                    "title": row,
                    "id": next_id,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            next_id, y, column, row_seen = next_id + 1, y + 1, 0, row
        panels.append({
            "type": "timeseries", "title": title, "id": next_id,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * column, "y": y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [
                {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                 "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                for i, (expr, legend) in enumerate(queries)
            ],
        })  # fmt: skip
        next_id += 1
        column = 1 - column
        if column == 0:
            y += 8
    return {
        "title": "pdserve: the token factory",
        "uid": "pdserve-fleet",
        "tags": ["pdserve", "llm", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": TEMPLATE_VARIABLES},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT} ({len(PANELS)} panels)")
