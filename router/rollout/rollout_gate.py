"""The canary's SLO gate: its live figures against prod's, and the verdict.

``StageWindows`` keeps, per (model, stage), the recent TTFT and ITL samples and the
answers, each marked as an error or not (a 5xx, or a stream ended by an error event; a
4xx is the client's, not the version's). ``judge`` compares the canary with prod over the
gate's window: a canary is within its bounds when its TTFT p99 and ITL p99 are at most
the gate's ratio of prod's and its error rate is at most prod's plus the allowed delta.
Either side with fewer than ``min_requests`` answers cannot be judged yet.

The figures are this router process's: each replica judges what it served. Memory is
bounded by ``max_samples`` per series (past that, a window holds the newest samples
only), and keys by models x stages.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from contracts.rollout import SloGate


@dataclass(frozen=True, slots=True)
class StageFigures:
    requests: int
    errors: int
    ttft_p99_s: float | None
    itl_p99_s: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, float | int | None]:
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": round(self.error_rate, 4), "ttft_p99_s": self.ttft_p99_s,
                "itl_p99_s": self.itl_p99_s}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Verdict:
    judged: bool  # both sides had min_requests
    within: bool  # judged and within every bound
    breaches: tuple[str, ...] = ()
    prod: StageFigures | None = None
    canary: StageFigures | None = None
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        return {
            "judged": self.judged, "within": self.within, "breaches": list(self.breaches),
            "notes": list(self.notes),
            "prod": self.prod.as_dict() if self.prod else None,
            "canary": self.canary.as_dict() if self.canary else None,
        }  # fmt: skip


class StageWindows:
    """The newest ``max_samples`` of each series per (model, stage); ``figures`` reads
    the ones inside a window (a gate's ``window_s``)."""

    def __init__(self, *, max_samples: int, clock: Callable[[], float]) -> None:
        self._max = max_samples
        self._clock = clock
        self._series: dict[tuple[str, str, str], collections.deque[tuple[float, float]]] = {}

    def ttft(self, model: str, stage: str, seconds: float) -> None:
        self._add(model, stage, "ttft", seconds)

    def itl(self, model: str, stage: str, seconds: float) -> None:
        self._add(model, stage, "itl", seconds)

    def answered(self, model: str, stage: str, *, error: bool) -> None:
        self._add(model, stage, "answers", 1.0 if error else 0.0)

    def figures(self, model: str, stage: str, window_s: float) -> StageFigures:
        since_s = self._clock() - window_s
        answers = self._recent(model, stage, "answers", since_s)
        return StageFigures(
            requests=len(answers), errors=int(sum(answers)),
            ttft_p99_s=_p99(self._recent(model, stage, "ttft", since_s)),
            itl_p99_s=_p99(self._recent(model, stage, "itl", since_s)),
        )  # fmt: skip

    def _add(self, model: str, stage: str, series: str, value: float) -> None:
        key = (model, stage, series)
        samples = self._series.get(key)
        if samples is None:
            samples = self._series[key] = collections.deque(maxlen=self._max)
        samples.append((self._clock(), value))

    def _recent(self, model: str, stage: str, series: str, since_s: float) -> list[float]:
        samples = self._series.get((model, stage, series), ())
        return [value for at_s, value in samples if at_s >= since_s]


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(0.99 * len(ordered)) - 1))]


def judge(gate: SloGate, prod: StageFigures, canary: StageFigures) -> Verdict:
    short = [f"{side} has {f.requests} of {gate.min_requests} requests"
             for side, f in (("prod", prod), ("canary", canary))
             if f.requests < gate.min_requests]  # fmt: skip
    if short:
        return Verdict(judged=False, within=False, prod=prod, canary=canary, notes=tuple(short))
    breaches = []
    for name, limit, theirs, ours in (
        ("ttft_p99", gate.max_ttft_p99_ratio, prod.ttft_p99_s, canary.ttft_p99_s),
        ("itl_p99", gate.max_itl_p99_ratio, prod.itl_p99_s, canary.itl_p99_s),
    ):
        if theirs is not None and ours is not None and ours > limit * theirs:
            breaches.append(f"{name} {ours:.4f}s > {limit} x prod's {theirs:.4f}s")
    if canary.error_rate > prod.error_rate + gate.max_error_rate_delta:
        breaches.append(
            f"error rate {canary.error_rate:.3f} > prod's {prod.error_rate:.3f} "
            f"+ {gate.max_error_rate_delta}"
        )
    return Verdict(
        judged=True, within=not breaches, breaches=tuple(breaches), prod=prod, canary=canary
    )
