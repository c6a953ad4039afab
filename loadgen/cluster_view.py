"""The target's own view of a run, from its /metrics: before, during (sampled) and after.

Understands a pdserve router (``pdserve_*``) and a bare vLLM (``vllm:*``):
- prefix hit rate: prompt tokens the engines found cached during the run;
- queue depth: requests waiting in the engines, sampled every ``interval_s``
  (max and mean);
- rejections: router answers 429 (overloaded) and 503 (no capacity) during the run.
Anything the target does not expose is reported as null; a target without
/metrics gives an empty view, never a failed run.
"""

from __future__ import annotations

import threading

from loadgen.prometheus_text import Samples
from loadgen.prometheus_text import scrape_or_none as _scrape


def _sum(samples: Samples, name: str, **labels: str) -> float | None:
    values = [v for n, lab, v in samples if n == name and labels.items() <= lab.items()]
    return sum(values) if values else None


def _prefix_tokens(samples: Samples) -> tuple[float | None, float | None]:
    for hits, queries in (
        ("pdserve_worker_prefix_cache_hits", "pdserve_worker_prefix_cache_queries"),
        ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ):
        if _sum(samples, queries) is not None:
            return _sum(samples, hits), _sum(samples, queries)
    return None, None


def _waiting(samples: Samples) -> float | None:
    router = _sum(samples, "pdserve_worker_requests_waiting")
    return router if router is not None else _sum(samples, "vllm:num_requests_waiting")


def _rejections(samples: Samples) -> float:
    return sum(_sum(samples, "pdserve_requests_total", status=s) or 0.0 for s in ("429", "503"))


class ClusterWatch:
    def __init__(self, base_url: str, interval_s: float = 1.0) -> None:
        self._url = base_url.rstrip("/") + "/metrics"
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._depths: list[float] = []
        self._before: Samples | None = None
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self._before = _scrape(self._url)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._interval_s):
            samples = _scrape(self._url)
            depth = None if samples is None else _waiting(samples)
            if depth is not None:
                self._depths.append(depth)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        after = _scrape(self._url)
        if self._before is None or after is None:
            return {}
        hits0, queries0 = _prefix_tokens(self._before)
        hits1, queries1 = _prefix_tokens(after)
        prefix_hit_rate = None
        if None not in (hits0, queries0, hits1, queries1) and queries1 > queries0:  # type: ignore[operator]
            prefix_hit_rate = (hits1 - hits0) / (queries1 - queries0)  # type: ignore[operator]
        return {
            "prefix_hit_rate": prefix_hit_rate,
            "queue_depth_max": max(self._depths) if self._depths else None,
            "queue_depth_mean": sum(self._depths) / len(self._depths) if self._depths else None,
            "rejections": _rejections(after) - _rejections(self._before),
        }
