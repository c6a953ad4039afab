"""Predicted TTFT: how long until a request's first token, learned online per worker.

Model, per first-hop worker: prefill seconds = ``intercept + slope x tokens``, where
``tokens`` is the uncached prompt tokens queued on the worker when the request was sent
(this router's count) plus the request's own uncached tokens. It is fitted by
exponentially weighted least squares over that worker's own prefills (``decay`` per
sample), so a worker that slows down is re-learned within tens of requests. Until a
worker has ``min_samples`` spread over distinct sizes, its line is the one fitted to the
prefill probe its agent ran on the fresh engine (``seed``), or without one, a prefill at
``prior_tokens_per_s`` with no fixed cost.

For a disaggregated request the first token also waits for the KV transfer and the
decode's first step, which grow with the decode worker's load: per decode worker,
handoff seconds = ``intercept + slope x requests in flight there`` (itself included),
fitted the same way from first token minus prefill end. Both models follow the load
they are given, so a prediction falls back as queues drain: no stale average keeps
refusing work after a burst.

Pure: no I/O, no clock; the orchestrator reports what it saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


class TTFTPredictor:
    def __init__(
        self,
        *,
        prior_tokens_per_s: float,
        decay: float = 0.97,
        min_samples: int = 8,
        max_workers: int = 4096,
    ) -> None:
        self._max_workers = max_workers
        self._prior_slope = 1.0 / prior_tokens_per_s
        self._decay = decay
        self._min_samples = min_samples
        self._fits: dict[str, _Fit] = {}
        self._handoff_fits: dict[str, _Fit] = {}
        self._seeded: dict[str, tuple[float, float]] = {}  # worker -> probe's line

    def __repr__(self) -> str:
        return f"TTFTPredictor(workers={len(self._fits)})"

    def seed(self, worker_id: str, probe: Sequence[tuple[int, float]]) -> None:
        """A (re)started worker's probe: its line until its own prefills teach one. Its
        earlier fit is dropped (a new engine may be another speed)."""
        self._fits.pop(worker_id, None)
        self._seeded.pop(worker_id, None)
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
        intercept, slope = self._line(worker_id)
        return intercept + slope * (queued_tokens + own_tokens)

    def tokens_per_s(self, worker_id: str) -> float:
        return 1.0 / self._line(worker_id)[1]

    def _line(self, worker_id: str) -> tuple[float, float]:
        fit = self._fits.get(worker_id)
        line = fit.line(self._min_samples) if fit is not None else None
        if line is not None:
            return line
        return self._seeded.get(worker_id, (0.0, self._prior_slope))

    def handoff_s(self, decode_worker_id: str, requests: int) -> float:
        """Seconds from prefill end to first token on this decode worker, with
        ``requests`` in flight there (this one included); 0 until it has taught us."""
        fit = self._handoff_fits.get(decode_worker_id)
        line = fit.line(self._min_samples) if fit is not None else None
        if line is None:
            return 0.0
        return line[0] + line[1] * requests

    def observe_prefill(
        self, worker_id: str, queued_tokens: int, own_tokens: int, seconds: float
    ) -> None:
        _fit_of(self._fits, worker_id, self._max_workers).add(
            float(queued_tokens + own_tokens), seconds, self._decay
        )

    def observe_handoff(self, decode_worker_id: str, requests: int, seconds: float) -> None:
        _fit_of(self._handoff_fits, decode_worker_id, self._max_workers).add(
            float(requests), seconds, self._decay
        )


def _fit_of(fits: dict[str, _Fit], worker_id: str, max_workers: int) -> _Fit:
    fit = fits.get(worker_id)
    if fit is None:
        if len(fits) >= max_workers:  # the oldest fit is a departed worker's
            del fits[next(iter(fits))]
        fit = fits[worker_id] = _Fit()
    return fit
