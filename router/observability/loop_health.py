"""Is the router's event loop free to serve? Two measures of the time requests wait
behind something else in the process: how late a timer fires (loop lag), and how long
each garbage collection stops the interpreter.

Every request on a router process shares one event loop: a 20-ms stall anywhere (a
long prompt tokenized inline, a collection of the old generation, a slow background
step) is 20 ms on every request then in flight, a fast 429 included. These say
whether, and how often, that happens.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Histogram


async def measure_loop_lag_forever(lag: Histogram, *, interval_s: float = 0.1) -> None:
    while True:
        started_s = time.perf_counter()
        await asyncio.sleep(interval_s)
        lag.observe(max(0.0, time.perf_counter() - started_s - interval_s))


def watch_gc_pauses(pauses: Histogram) -> Callable[[], None]:
    """Time every collection from now on; returns the function that stops it."""
    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.labels(str(info.get("generation"))).observe(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    return lambda: gc.callbacks.remove(on_gc)
