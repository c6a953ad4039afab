"""Predicted TTFT: how long until a request's first token, learned online per worker.

Model, per first-hop worker, for a request sent now with ``queued`` uncached prompt
tokens ahead of it there (this router's count) and ``own`` of its own:

    prefill seconds = intercept + a x own + b x own^2 / 1000 + queued / drain rate

- ``intercept + a x own + b x own^2 / 1000`` is a prefill alone: fitted by exponentially
  weighted least squares over the worker's prefills that had nothing else under way
  there (``decay`` per sample), and until ``min_samples`` of them, the curve fitted to
  the prefill probe its agent ran on the fresh engine (``seed``), or without one,
  ``prior_tokens_per_s``. The square is attention: each token attends to every one
  before it, so a long prompt costs more per token than a short one. A line fitted on
  the probe's short prompts forecast the longest prompts 1-6% early, and a prompt at
  the SLO's edge came in late (admission runs 26-27). Both coefficients are never
  negative (``decayed_fit``); a fit that cannot tell them apart is a line.
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

For a disaggregated request the first token also waits for the KV transfer, which
grows with the KV pulled, and the decode's first step, which grows with the decode
worker's load: per decode worker,

    handoff seconds = intercept + a x requests in flight there (itself included)
                                + b x prompt tokens it pulls (those it does not hold)

fitted the same way (``decayed_fit``) from first token minus prefill end. A line over
the load alone, as before, charged every handoff the average transfer: long prompts
came out 15-24% late against their forecast (admission run 11). Until a decode worker has
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

from router.admission.decayed_fit import DecayedFit

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PrefillMark:
    """Taken when a prefill is sent (``prefill_sent``); handed back at its end."""

    worker_id: str
    sent_s: float
    finished_tokens: int  # the worker's count at the send
    alone: bool  # nothing else was under way there at the send


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFit:
    """What the predictor has measured of one worker, for whoever plans the fleet (the
    planner reads it from /metrics): None where it has no measurement of its own."""

    # A prefill alone: intercept_s + s_per_token x n + s_per_token_per_ktoken x n^2 / 1000.
    prefill: tuple[float, float, float] | None = None
    drain_tokens_per_s: float | None = None  # through a queue
    # Prefill end to first token: intercept_s + s_per_request x requests there
    # (itself included) + s_per_token x prompt tokens pulled.
    handoff: tuple[float, float, float] | None = None


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
        # alone prefill seconds over (own tokens, own tokens^2 / 1000)
        self._fits: dict[str, DecayedFit] = {}
        # handoff seconds over (requests in flight there, prompt tokens the worker pulls)
        self._handoff_fits: dict[str, DecayedFit] = {}
        self._pool_handoff = _two_features()  # every decode worker's, for one without its own
        self._drains: dict[str, _Drain] = {}
        self._seeded: dict[str, _Curve] = {}  # worker -> the probe's curve
        # Solved fits, kept until the worker's next sample: a forecast asks for each
        # worker's curve several times, and a solve is ~10 us of the request's path.
        self._curves: dict[str, _Curve | None] = {}
        self._planes: dict[str, tuple[float, tuple[float, ...]] | None] = {}

    def __repr__(self) -> str:
        return f"TTFTPredictor(workers={len(self._fits)})"

    def seed(self, worker_id: str, probe: Sequence[tuple[int, float]]) -> None:
        """A (re)started worker's probe: its curve until its own prefills teach one. Its
        earlier fit is dropped (a new engine may be another speed). Three sizes or more
        are needed to see the square; with two it is a line."""
        self._fits.pop(worker_id, None)
        self._seeded.pop(worker_id, None)
        self._drains.pop(worker_id, None)
        self._curves.pop(worker_id, None)
        fit = _two_features()
        for tokens, seconds in probe:
            if tokens > 0 and seconds > 0:
                fit.add(_alone_x(tokens), seconds, 1.0)
        curve = _curve(fit.solve(1))
        if curve is not None:
            if len(self._seeded) >= self._max_workers:
                del self._seeded[next(iter(self._seeded))]
            self._seeded[worker_id] = curve

    def prefill_s(self, worker_id: str, queued_tokens: int, own_tokens: int) -> float:
        """Seconds until this worker has prefilled a request sent to it now."""
        alone_s = self._alone_curve(worker_id).seconds(own_tokens)
        return alone_s + queued_tokens / self.tokens_per_s(worker_id)

    def tokens_per_s(self, worker_id: str) -> float:
        """How fast the worker gets through a queue."""
        drain = self._drains.get(worker_id)
        rate = drain.rate(self._min_samples) if drain is not None else None
        return rate or self._alone_curve(worker_id).tokens_per_s()

    def measured(self, worker_id: str) -> bool:
        """Whether the worker's prefill alone is forecast from a measurement (its probe or
        its own prefills), not from ``prior_tokens_per_s``."""
        return self._measured_curve(worker_id) is not None

    def _alone_curve(self, worker_id: str) -> _Curve:
        return self._measured_curve(worker_id) or _Curve(0.0, self._prior_slope, 0.0)

    def _measured_curve(self, worker_id: str) -> _Curve | None:
        try:
            return self._curves[worker_id]
        except KeyError:
            pass
        curve = self._curves[worker_id] = self._solve_curve(worker_id)
        if len(self._curves) > self._max_workers:
            del self._curves[next(iter(self._curves))]
        return curve

    def _solve_curve(self, worker_id: str) -> _Curve | None:
        fit = self._fits.get(worker_id)
        curve = _curve(fit.solve(self._min_samples)) if fit is not None else None
        if curve is not None:
            return curve
        seeded = self._seeded.get(worker_id)
        if seeded is not None:
            return seeded
        drain = self._drains.get(worker_id)
        rate = drain.rate(self._min_samples) if drain is not None else None
        return _Curve(0.0, 1.0 / rate, 0.0) if rate else None

    def fits(self) -> dict[str, WorkerFit]:
        """Every worker's measured speeds (a probe, its own prefills, its handoffs)."""
        out: dict[str, WorkerFit] = {}
        for worker_id in {*self._fits, *self._seeded, *self._drains, *self._handoff_fits}:
            curve = self._measured_curve(worker_id)
            drain = self._drains.get(worker_id)
            handoff = self._handoff_fits.get(worker_id)
            plane = handoff.solve(self._min_samples) if handoff is not None else None
            fit = WorkerFit(
                prefill=None if curve is None else
                (curve.intercept_s, curve.s_per_token, curve.s_per_ktoken_pair),
                drain_tokens_per_s=drain.rate(self._min_samples) if drain else None,
                handoff=None if plane is None else (plane[0], *plane[1]),
            )  # fmt: skip
            if fit != WorkerFit():
                out[worker_id] = fit
        return out

    def handoff_s(self, decode_worker_id: str, requests: int, pulled_tokens: int) -> float:
        """Seconds from prefill end to first token on this decode worker, with
        ``requests`` in flight there (this one included), pulling ``pulled_tokens`` of KV
        (the prompt's tokens it does not hold); 0 until some decode worker taught us."""
        if decode_worker_id in self._planes:
            plane = self._planes[decode_worker_id]
        else:
            fit = self._handoff_fits.get(decode_worker_id)
            plane = fit.solve(self._min_samples) if fit is not None else None
            if plane is None:
                plane = self._pool_handoff.solve(1)
            self._planes[decode_worker_id] = plane
            if len(self._planes) > self._max_workers:
                del self._planes[next(iter(self._planes))]
        if plane is None:
            return 0.0
        intercept, (per_request, per_token) = plane
        return intercept + per_request * requests + per_token * pulled_tokens

    def prefill_sent(
        self, worker_id: str, at_s: float, queued_tokens: int, *, running: int = 0
    ) -> PrefillMark:
        """A prefill goes to the worker now, with ``queued_tokens`` already under way and
        ``running`` requests in flight there (prefilling or decoding). Only a prefill with
        neither is an alone sample: a colocated worker (or a prefill worker serving whole
        requests while the decode pool is empty) runs each prompt in steps shared with the
        others' decodes, and learning those as alone times made the forecast refuse
        prompts as past the SLO on idle workers (413 ``prompt_exceeds_ttft_slo``)."""
        drain = _of_worker(self._drains, worker_id, self._max_workers, _Drain)
        if queued_tokens <= 0:
            # Idle until now (a failed prefill reports no end). The busy time counted starts
            # at the next prefill's end: up to there it holds one request's fixed cost
            # (HTTP, a step's floor), which the alone line has, and a queue overlaps.
            drain.busy_since_s = None
        alone = queued_tokens <= 0 and running <= 0
        return PrefillMark(worker_id, at_s, drain.finished_tokens, alone=alone)

    def observe_prefill(
        self, mark: PrefillMark, own_tokens: int, ended_s: float, queued_after: int
    ) -> None:
        """The prefill of ``own_tokens`` sent at ``mark`` ended; ``queued_after`` tokens are
        still under way on its worker."""
        drain = self._drains.get(mark.worker_id)
        if drain is None:
            return  # the worker re-registered meanwhile: its new engine starts afresh
        self._curves.pop(mark.worker_id, None)
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
            _of_worker(self._fits, mark.worker_id, self._max_workers, _two_features).add(
                _alone_x(own_tokens), ended_s - mark.sent_s, self._decay
            )

    def observe_handoff(
        self, decode_worker_id: str, requests: int, pulled_tokens: int, seconds: float
    ) -> None:
        x = (float(requests), float(pulled_tokens))
        fit = _of_worker(self._handoff_fits, decode_worker_id, self._max_workers, _two_features)
        fit.add(x, seconds, self._decay)
        self._pool_handoff.add(x, seconds, self._decay)
        self._planes.clear()  # the pool's plane stands in for workers without their own


def _two_features() -> DecayedFit:
    """Both fits have two: (tokens, tokens^2 / 1000) alone; (requests, tokens pulled) handoff."""
    return DecayedFit(2)


def _alone_x(tokens: int) -> tuple[float, float]:
    return float(tokens), tokens * tokens / 1000.0


@dataclass(frozen=True, slots=True)
class _Curve:
    """A prefill alone: ``intercept_s + s_per_token x n + s_per_ktoken_pair x n^2 / 1000``."""

    intercept_s: float
    s_per_token: float
    s_per_ktoken_pair: float

    def seconds(self, tokens: int) -> float:
        return self.intercept_s + tokens * (
            self.s_per_token + self.s_per_ktoken_pair * tokens / 1000
        )

    def tokens_per_s(self) -> float:
        """Its throughput for a queue of 1000-token prompts, the fixed cost left out."""
        return 1.0 / max(1e-12, self.s_per_token + self.s_per_ktoken_pair)


def _curve(fit: tuple[float, tuple[float, ...]] | None) -> _Curve | None:
    return None if fit is None else _Curve(fit[0], *fit[1])


def _of_worker(
    by_worker: dict[str, T], worker_id: str, max_workers: int, new: Callable[[], T]
) -> T:
    state = by_worker.get(worker_id)
    if state is None:
        if len(by_worker) >= max_workers:  # the oldest entry is a departed worker's
            del by_worker[next(iter(by_worker))]
        state = by_worker[worker_id] = new()
    return state
