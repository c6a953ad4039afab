"""Read an engine's load from its vLLM ``/metrics`` text."""

from __future__ import annotations

from contracts.workers import WorkerLoad

_GAUGES = {
    "vllm:num_requests_running": "num_requests_running",
    "vllm:num_requests_waiting": "num_requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:num_preemptions_total": "num_preemptions",
    "vllm:external_prefix_cache_queries_total": "external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits_total": "external_prefix_cache_hits",
    "vllm:nixl_xfer_time_seconds_count": "kv_transfers",
    "vllm:nixl_xfer_time_seconds_sum": "kv_transfer_seconds",
    "vllm:nixl_bytes_transferred_sum": "kv_transfer_bytes",
    "vllm:nixl_num_failed_transfers_total": "kv_transfer_failures",
}


def parse_load(metrics_text: str) -> WorkerLoad:
    """vLLM's load gauges and prefix-cache counters over its engines (DP ranks are labels):
    requests and counters add up; KV usage is the fullest rank's, a fraction that a sum
    would push past 1.

    A line scan, not a full Prometheus parse: vLLM's exposition is hundreds of
    lines and this runs every heartbeat.
    """
    values = dict.fromkeys(_GAUGES.values(), 0.0)
    for line in metrics_text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, rest = line.partition("{")
        field = _GAUGES.get(name)
        if field is None:
            continue
        try:
            value = float(rest.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if field == "kv_cache_usage_perc":
            values[field] = max(values[field], value)
        else:
            values[field] += value
    return WorkerLoad(**values)
