"""The router's loop-health measures see a stalled loop and a collection."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import CollectorRegistry, Histogram

from router.observability.loop_health import measure_loop_lag_forever, watch_gc_pauses


def histogram(name: str, *labels: str) -> Histogram:
    return Histogram(name, "test", list(labels), registry=CollectorRegistry())


def observed(h: Histogram, **labels: str) -> list[float]:
    samples = next(iter(h.collect())).samples
    count = next(s.value for s in samples if s.name.endswith("_count") and s.labels == labels)
    total = next(s.value for s in samples if s.name.endswith("_sum") and s.labels == labels)
    return [count, total]


def test_a_stalled_loop_shows_as_lag():
    lag = histogram("lag")

    async def scenario() -> None:
        watcher = asyncio.create_task(measure_loop_lag_forever(lag, interval_s=0.01))
        await asyncio.sleep(0.05)
        held_until = time.perf_counter() + 0.2
        while time.perf_counter() < held_until:  # something holds the loop
            pass
        await asyncio.sleep(0.05)
        watcher.cancel()

    asyncio.run(scenario())
    count, total = observed(lag)
    assert count >= 3 and total >= 0.15


def test_collections_are_timed_until_the_watch_stops():
    pauses = histogram("gc_pause", "generation")
    stop = watch_gc_pauses(pauses)
    try:
        gc.collect()
        assert observed(pauses, generation="2")[0] >= 1
    finally:
        stop()
    before = observed(pauses, generation="2")[0]
    gc.collect()
    assert observed(pauses, generation="2")[0] == before
