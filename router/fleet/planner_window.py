"""What the planner remembers of the recent past: load, its trend, and fitted speeds.

Each planning interval adds one ``IntervalSample``: the arrivals, the finished requests'
lengths and cache hits, and each worker's engine time against its work. From these:
- ``load()``: the rate over the window and the length *distribution* (the newest
  ``max_lengths`` requests), with the prefix hit rate and the sizes of the clumps the
  arrivals came in (the newest ``max_lengths``);
- ``trend_per_s2()``: the least-squares slope of the per-interval rates;
- ``speeds()``: prefill seconds per request and per uncached token, and decode seconds
  per step and per sequence in the batch, fitted (exponentially decayed least squares,
  router/admission/decayed_fit.py) on the engines' own busy time. Until a fit has
  ``min_fit_samples``, the prior (configured, or a profile's) stands in. The routers' TTFT
  predictor's newest measured curves (prefill alone, handoff), where a sample brings
  them, replace the prefill and handoff parts.

Invariants: memory is bounded (``window_s`` of intervals, ``max_lengths`` pairs); pure
(no clock: samples carry their time).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace

from router.admission.decayed_fit import DecayedFit
from router.fleet.planner_model import Load, Speeds, with_measured


@dataclass(frozen=True, slots=True, kw_only=True)
class Pressure:
    """What the fleet holds at the interval's end, beside the rates: work waiting, the
    decode pool's KV, and batch lines due (``planner.plan`` says how each counts)."""

    waiting_requests: float = 0.0  # in the routers' queues and the prefill engines'
    decode_kv_usage: float | None = None  # the decode pool's mean, 0-1
    decode_preemptions: int = 0  # over the interval
    batch: Load | None = None  # the batches' lines, at the pace their deadlines need

    def kv_short(self, high: float) -> bool:
        return self.decode_preemptions > 0 or (self.decode_kv_usage or 0.0) >= high

    def describe_kv(self) -> str:
        usage = "" if self.decode_kv_usage is None else f"KV {self.decode_kv_usage:.0%}"
        preempted = f"{self.decode_preemptions} preempted" if self.decode_preemptions else ""
        return ", ".join(part for part in (preempted, usage) if part)


@dataclass(frozen=True, slots=True, kw_only=True)
class IntervalSample:
    end_s: float
    duration_s: float
    arrivals: int
    lengths: tuple[tuple[int, int], ...]  # finished requests' (input, output) tokens
    met_slo: int  # finished requests that met both SLOs
    input_tokens: int  # of the finished requests
    cached_tokens: int  # of those, found in a prefix cache
    # Per prefill worker: (requests prefilled, tokens computed, engine busy seconds).
    prefill_work: tuple[tuple[int, int, float], ...] = ()
    # Per decode worker: (engine steps, tokens generated, engine busy seconds).
    decode_work: tuple[tuple[int, int, float], ...] = ()
    # The routers' TTFT predictor's measured curves (``planner_model.with_measured``).
    measured_prefill: tuple[float, float, float] | None = None
    measured_handoff: tuple[float, float, float] | None = None
    pressure: Pressure = Pressure()
    clump_sizes: tuple[int, ...] = ()  # of the arrivals that came at once (1: alone)


class PlannerWindow:
    def __init__(
        self,
        *,
        window_s: float,
        prior: Speeds,
        max_lengths: int = 4096,
        fit_decay: float = 0.95,
        min_fit_samples: int = 8,
    ) -> None:
        self._window_s = window_s
        self._prior = prior
        self._intervals: collections.deque[IntervalSample] = collections.deque()
        self._lengths: collections.deque[tuple[int, int]] = collections.deque(maxlen=max_lengths)
        self._clumps: collections.deque[int] = collections.deque(maxlen=max_lengths)
        self._decay = fit_decay
        self._min_fit = min_fit_samples
        self._prefill_fit = DecayedFit(1)
        self._decode_fit = DecayedFit(1)
        self._measured: tuple[tuple[float, ...] | None, tuple[float, ...] | None] = (None, None)

    def __repr__(self) -> str:
        return f"PlannerWindow(intervals={len(self._intervals)}, lengths={len(self._lengths)})"

    def add(self, sample: IntervalSample) -> None:
        self._intervals.append(sample)
        while self._intervals and self._intervals[0].end_s <= sample.end_s - self._window_s:
            self._intervals.popleft()
        self._lengths.extend(sample.lengths)
        self._clumps.extend(sample.clump_sizes)
        prefill, handoff = self._measured
        self._measured = (sample.measured_prefill or prefill, sample.measured_handoff or handoff)
        for requests, tokens, busy_s in sample.prefill_work:
            if requests > 0 and busy_s > 0:
                self._prefill_fit.add((tokens / requests,), busy_s / requests, self._decay)
        for steps, generated, busy_s in sample.decode_work:
            if steps > 0 and busy_s > 0:
                self._decode_fit.add((generated / steps,), busy_s / steps, self._decay)

    def load(self) -> Load | None:
        """The window's load; None until a request has finished."""
        if not self._lengths:
            return None
        seconds = sum(s.duration_s for s in self._intervals)
        arrivals = sum(s.arrivals for s in self._intervals)
        inputs = sum(s.input_tokens for s in self._intervals)
        cached = sum(s.cached_tokens for s in self._intervals)
        return Load(
            rate_per_s=arrivals / seconds if seconds else 0.0,
            lengths=tuple(self._lengths),
            prefix_hit=min(1.0, cached / inputs) if inputs else 0.0,
            clump_sizes=tuple(self._clumps) if any(c > 1 for c in self._clumps) else (),
        )

    def trend_per_s2(self) -> float:
        """How fast the rate changes (req/s per second), fitted over the window's intervals."""
        points = [(s.end_s, s.arrivals / s.duration_s) for s in self._intervals if s.duration_s]
        if len(points) < 3:
            return 0.0
        mean_t = sum(t for t, _ in points) / len(points)
        mean_r = sum(r for _, r in points) / len(points)
        spread = sum((t - mean_t) ** 2 for t, _ in points)
        return sum((t - mean_t) * (r - mean_r) for t, r in points) / spread if spread else 0.0

    def speeds(self) -> Speeds:
        speeds = self._prior
        prefill = self._prefill_fit.solve(self._min_fit)
        if prefill is not None and prefill[1][0] > 0:
            speeds = replace(speeds, prefill_s_per_request=prefill[0],
                             prefill_s_per_token=prefill[1][0])  # fmt: skip
        decode = self._decode_fit.solve(self._min_fit)
        if decode is not None and decode[1][0] > 0:
            # The per-sequence slope was measured at today's contexts: it stands for both.
            speeds = replace(speeds, decode_step_s=decode[0], decode_s_per_seq=decode[1][0],
                             decode_s_per_ktoken=0.0)  # fmt: skip
        prefill, handoff = self._measured  # the routers' own fits, the newest, come last
        return with_measured(speeds, prefill=prefill, handoff=handoff)
