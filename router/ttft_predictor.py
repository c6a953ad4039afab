"""Predicted TTFT: how long until a request's first token, learned online per worker.

Model, per first-hop worker, for a request sent now with ``queued`` uncached prompt
tokens ahead of it there (this router's count) and ``own`` of its own:

    prefill seconds = intercept + slope x own + queued / drain rate

- ``intercept + slope x own`` is a prefill alone: fitted by exponentially weighted least
  squares over the worker's prefills that had nothing else under way there (``decay``
  per sample), and until ``min_samples`` of them, the line fitted to the prefill probe
  its agent ran on the fresh engine (``seed``), or without one, ``prior_tokens_per_s``.
- the drain rate is how fast the worker gets through a queue: the tokens of each prefill
  that ends while others were under way at the previous end, over the seconds since that
  end (busy time), exponentially weighted by busy time (``drain_half_life_s``).

Why not one line fitted on (queued + own, seconds) of every prefill, as before: an
engine prefills in steps, and a request waits for the step under way and then shares
the next one with every prompt that arrived meanwhile, before *and after* it. Its wait
hardly follows the queue it saw at the send, so such a fit comes out several times too
flat (the rate too high) exactly when the queue matters (``test_ttft_predictor``).
Busy time does not depend on where in a step a request landed. A queue counted whole
(the step under way included) makes the prediction err late, which is the safe side;
later arrivals that join a request's step are admission's concern (``load.py``).

For a disaggregated request the first token also waits for the KV transfer and the
decode's first step, which grow with the decode worker's load: per decode worker,
handoff seconds = ``intercept + slope x requests in flight there`` (itself included),
fitted the same way from first token minus prefill end. Until a decode worker has
``min_samples`` of its own, the fit over every decode worker's handoffs stands in (from
the first one seen): a cold pool is not assumed to hand off for free. Both models follow
the load they are given, so a prediction falls back as queues drain: no stale average
keeps refusing work after a burst.

Pure: no I/O, no clock; the orchestrator reports what it saw, with its times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class _Fit:
    weight: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_xy: float = 0.0
    samples: int = 0

    def add(self, x: float, y: float, decay: float) -> None:
        self.weight = self.weight * decay + 1.0
        self.sum_x = self.sum_x * decay + x
        self.sum_y = self.sum_y * decay + y
        self.sum_xx = self.sum_xx * decay + x * x
        self.sum_xy = self.sum_xy * decay + x * y
        self.samples += 1

    def line(self, min_samples: int) -> tuple[float, float] | None:
        """(intercept_s, slope_s_per_token), or None while the data cannot say."""
        if self.samples < min_samples:
            return None
        mean_x, mean_y = self.sum_x / self.weight, self.sum_y / self.weight
        variance = self.sum_xx / self.weight - mean_x * mean_x
        if variance <= max(1.0, 1e-6 * mean_x * mean_x):
            # All prefills one size: only the mean rate is known, not the fixed cost.
            return (0.0, mean_y / mean_x) if mean_x > 0 else None
        slope = (self.sum_xy / self.weight - mean_x * mean_y) / variance
        if slope <= 0:
            return (0.0, mean_y / mean_x) if mean_x > 0 else None
        return max(0.0, mean_y - slope * mean_x), slope


@dataclass(frozen=True, slots=True)
class PrefillMark:
    """Taken when a prefill is sent (``prefill_sent``); handed back at its end."""

    worker_id: str
    sent_s: float
    finished_tokens: int  # the worker's count at the send
    alone: bool  # nothing else was under way there at the send


@dataclass(slots=True)
class _Drain:
    """One worker's throughput while it has prefills under way."""

    tokens: float = 0.0  # decayed sums
    seconds: float = 0.0
    samples: int = 0
    busy_since_s: float | None = None  # the last prefill's end, with more under way
    finished_tokens: int = 0

    def rate(self, min_samples: int) -> float | None:
        if self.samples < min_samples or self.seconds <= 0 or self.tokens <= 0:
            return None
        return self.tokens / self.seconds


class TTFTPredictor:
    def __init__(
        self,
        *,
        prior_tokens_per_s: float,
        decay: float = 0.97,
        min_samples: int = 8,
        drain_half_life_s: float = 10.0,
        max_workers: int = 4096,
    ) -> None:
        self._max_workers = max_workers
        self._prior_slope = 1.0 / prior_tokens_per_s
        self._decay = decay
        self._drain_half_life_s = drain_half_life_s
        self._min_samples = min_samples
        self._fits: dict[str, _Fit] = {}
        self._handoff_fits: dict[str, _Fit] = {}
        self._pool_handoff = _Fit()  # every decode worker's, for one without its own yet
        self._drains: dict[str, _Drain] = {}
        self._seeded: dict[str, tuple[float, float]] = {}  # worker -> probe's line

    def __repr__(self) -> str:
        return f"TTFTPredictor(workers={len(self._fits)})"

    def seed(self, worker_id: str, probe: Sequence[tuple[int, float]]) -> None:
        """A (re)started worker's probe: its line until its own prefills teach one. Its
        earlier fit is dropped (a new engine may be another speed)."""
        self._fits.pop(worker_id, None)
        self._seeded.pop(worker_id, None)
        self._drains.pop(worker_id, None)
        fit = _Fit()
        for tokens, seconds in probe:
            if tokens > 0 and seconds > 0:
                fit.add(float(tokens), seconds, 1.0)
        line = fit.line(1)
        if line is not None:
            if len(self._seeded) >= self._max_workers:
                del self._seeded[next(iter(self._seeded))]
            self._seeded[worker_id] = line

    def prefill_s(self, worker_id: str, queued_tokens: int, own_tokens: int) -> float:
        """Seconds until this worker has prefilled a request sent to it now."""
        intercept, slope = self._alone_line(worker_id)
        return intercept + slope * own_tokens + queued_tokens / self.tokens_per_s(worker_id)

    def tokens_per_s(self, worker_id: str) -> float:
        """How fast the worker gets through a queue."""
        drain = self._drains.get(worker_id)
        rate = drain.rate(self._min_samples) if drain is not None else None
        return rate or 1.0 / self._alone_line(worker_id)[1]

    def _alone_line(self, worker_id: str) -> tuple[float, float]:
        fit = self._fits.get(worker_id)
        line = fit.line(self._min_samples) if fit is not None else None
        if line is not None:
            return line
        seeded = self._seeded.get(worker_id)
        if seeded is not None:
            return seeded
        drain = self._drains.get(worker_id)
        rate = drain.rate(self._min_samples) if drain is not None else None
        return (0.0, 1.0 / rate if rate else self._prior_slope)

    def handoff_s(self, decode_worker_id: str, requests: int) -> float:
        """Seconds from prefill end to first token on this decode worker, with
        ``requests`` in flight there (this one included); 0 until it has taught us."""
        fit = self._handoff_fits.get(decode_worker_id)
        line = fit.line(self._min_samples) if fit is not None else None
        if line is None:
            line = self._pool_handoff.line(1)
        if line is None:
            return 0.0
        return line[0] + line[1] * requests

    def prefill_sent(self, worker_id: str, at_s: float, queued_tokens: int) -> PrefillMark:
        """A prefill goes to the worker now, with ``queued_tokens`` already under way."""
        drain = _of_worker(self._drains, worker_id, self._max_workers, _Drain)
        if queued_tokens <= 0:
            # Idle until now (a failed prefill reports no end). The busy time counted starts
            # at the next prefill's end: up to there it holds one request's fixed cost
            # (HTTP, a step's floor), which the alone line has, and a queue overlaps.
            drain.busy_since_s = None
        return PrefillMark(worker_id, at_s, drain.finished_tokens, alone=queued_tokens <= 0)

    def observe_prefill(
        self, mark: PrefillMark, own_tokens: int, ended_s: float, queued_after: int
    ) -> None:
        """The prefill of ``own_tokens`` sent at ``mark`` ended; ``queued_after`` tokens are
        still under way on its worker."""
        drain = self._drains.get(mark.worker_id)
        if drain is None:
            return  # the worker re-registered meanwhile: its new engine starts afresh
        if drain.busy_since_s is not None:
            # Decayed by busy time, not per prefill: a step's prefills end together, and
            # per-prefill decay would weigh its tokens above the seconds it took.
            seconds = max(0.0, ended_s - drain.busy_since_s)
            keep = 0.5 ** (seconds / self._drain_half_life_s)
            drain.tokens = drain.tokens * keep + own_tokens
            drain.seconds = drain.seconds * keep + seconds
            drain.samples += 1
        drain.busy_since_s = ended_s if queued_after > 0 else None
        alone = mark.alone and drain.finished_tokens == mark.finished_tokens
        drain.finished_tokens += own_tokens
        if alone:
            _of_worker(self._fits, mark.worker_id, self._max_workers, _Fit).add(
                float(own_tokens), ended_s - mark.sent_s, self._decay
            )

    def observe_handoff(self, decode_worker_id: str, requests: int, seconds: float) -> None:
        _of_worker(self._handoff_fits, decode_worker_id, self._max_workers, _Fit).add(
            float(requests), seconds, self._decay
        )
        self._pool_handoff.add(float(requests), seconds, self._decay)


def _of_worker(
    by_worker: dict[str, T], worker_id: str, max_workers: int, new: Callable[[], T]
) -> T:
    state = by_worker.get(worker_id)
    if state is None:
        if len(by_worker) >= max_workers:  # the oldest entry is a departed worker's
            del by_worker[next(iter(by_worker))]
        state = by_worker[worker_id] = new()
    return state
