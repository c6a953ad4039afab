"""Values over a recent window, for gauges a glance can read (tokens/s, $/1M tokens,
the status view's TTFT percentiles). Prometheus computes any other window from the
counters; these exist for the router's own views and for SREs without PromQL at hand.

Invariants:
- memory is bounded: a ``SlidingSums`` key holds at most ``window_s / bucket_s + 1``
  buckets, and ``RecentSamples`` at most ``max_samples`` per key; keys are label
  values from bounded sets (models, pools, directions);
- the clock is passed in, so tests run on a fake one;
- a window younger than ``window_s`` (just started) is divided by its true age, so a
  rate is not understated during the first minute.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Hashable


class SlidingSums:
    def __init__(self, *, window_s: float, bucket_s: float, clock: Callable[[], float]) -> None:
        self.window_s = window_s
        self._bucket_s = bucket_s
        self._slots = max(1, math.ceil(window_s / bucket_s))
        self._clock = clock
        self._started_s = clock()
        self._sums: dict[Hashable, collections.deque[list[float]]] = {}

    def add(self, key: Hashable, amount: float) -> None:
        slot = self._clock() // self._bucket_s
        buckets = self._sums.setdefault(key, collections.deque())
        if buckets and buckets[-1][0] == slot:
            buckets[-1][1] += amount
        else:
            buckets.append([slot, amount])
            self._trim(buckets, slot)

    def total(self, key: Hashable) -> float:
        buckets = self._sums.get(key)
        if not buckets:
            return 0.0
        self._trim(buckets, self._clock() // self._bucket_s)
        return sum(amount for _, amount in buckets)

    def span_s(self) -> float:
        """The seconds the totals cover: the window, or less while the router is young."""
        return max(self._bucket_s, min(self.window_s, self._clock() - self._started_s))

    def window_keys(self) -> list[Hashable]:
        return list(self._sums)

    def _trim(self, buckets: collections.deque[list[float]], slot: float) -> None:
        while buckets and buckets[0][0] <= slot - self._slots:
            buckets.popleft()


class RecentSamples:
    """The newest samples per key, at most ``max_samples`` and at most ``window_s`` old."""

    def __init__(self, *, window_s: float, max_samples: int, clock: Callable[[], float]) -> None:
        self._window_s = window_s
        self._max = max_samples
        self._clock = clock
        self._samples: dict[Hashable, collections.deque[tuple[float, float]]] = {}

    def add(self, key: Hashable, value: float) -> None:
        samples = self._samples.setdefault(key, collections.deque(maxlen=self._max))
        samples.append((self._clock(), value))

    def quantiles(self, key: Hashable, qs: tuple[float, ...]) -> tuple[float, ...] | None:
        """Nearest-rank quantiles of the key's recent samples; None when there are none."""
        samples = self._samples.get(key)
        if not samples:
            return None
        oldest_s = self._clock() - self._window_s
        while samples and samples[0][0] < oldest_s:
            samples.popleft()
        if not samples:
            return None
        values = sorted(value for _, value in samples)
        return tuple(values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]
                     for q in qs)  # fmt: skip

    def count(self, key: Hashable) -> int:
        return len(self._samples.get(key, ()))
