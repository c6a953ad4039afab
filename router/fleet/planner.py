"""The SLO planner's decision: which P/D fleet to run next, and why, in one sentence.

Each interval, on the recent window's load (router/fleet/planner_window.py) and the
model (router/fleet/planner_model.py):
1. **Forecast.** Plan for the rate ``lead_s`` ahead on the window's trend, since a
   change serves only after its workers start; never below today's rate (a falling
   trend is waited for, not bet on).
2. **Cheapest fleet that meets the SLO**: every split of every size within the bounds
   and the budget, predicted at the forecast; the cheapest whose predicted attainment
   meets the target wins (ties: the higher attainment). If no fleet can meet it (prompts
   too long for the TTFT SLO on any fleet cap every fleet's attainment), the target
   becomes ``ceiling_tolerance`` under the best fleet's, the rules below still apply, and
   the reason says the SLO is out of reach.
3. **Hysteresis and the cost of change.**
   - The current fleet missing the SLO at the forecast changes at once (an SLO miss
     costs more than a worker).
   - A cheaper fleet replaces one that meets the SLO only if it also meets it at
     ``scale_down_margin`` more load, at least ``min_change_interval_s`` after the last
     change, and if what it saves over ``payback_s`` exceeds what the change costs: every
     worker that starts or changes role is paid ``change_cost_s`` before it serves.

``plan`` is pure: the clock arrives as ``now_s``. ``Planner`` keeps what ``plan`` needs
between intervals (the window, the last change) and corrects the model with what it
measures: while the fleet stood still through an interval, it compares the attainment
the model predicts for that fleet with the one measured, keeps a decayed average of the
shortfall (at most ``max_correction``), and plans for the target plus that shortfall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from router.fleet.planner_model import (
    Fleet,
    Load,
    Prediction,
    Prices,
    Slo,
    Speeds,
    fleets,
    predict,
)  # fmt: skip
from router.fleet.planner_window import IntervalSample, PlannerWindow, Pressure


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerPolicy:
    usd_per_worker_hour: float
    usd_per_decode_worker_hour: float | None = None  # None: usd_per_worker_hour
    min_workers: int = 2
    max_workers: int = 16
    budget_usd_per_hour: float = math.inf
    lead_s: float = 60.0
    scale_down_margin: float = 0.15
    min_change_interval_s: float = 90.0
    change_cost_s: float = 60.0
    payback_s: float = 1800.0
    ceiling_tolerance: float = 0.005
    correction_decay: float = 0.7
    max_correction: float = 0.04
    kv_usage_high: float = 0.9  # decode KV usage (0-1) that counts as short, as a preemption
    batch_pace_margin: float = 1.25  # plan batch lines this much faster than their deadlines

    @property
    def prices(self) -> Prices:
        return Prices.by_role(self.usd_per_worker_hour, self.usd_per_decode_worker_hour)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    fleet: Fleet
    current: Fleet
    reason: str
    forecast_rate_per_s: float
    prediction: Prediction  # of ``fleet`` at the forecast
    current_prediction: Prediction

    @property
    def changes(self) -> bool:
        return self.fleet != self.current


def moved_workers(current: Fleet, target: Fleet) -> Fleet:
    """Workers that start or change role to go from ``current`` to ``target``, by role."""
    return Fleet(prefill=max(0, target.prefill - current.prefill),
                 decode=max(0, target.decode - current.decode))  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class _Question:
    """Which fleets meet the SLO under one load: what every step of ``plan`` asks."""

    load: Load
    speeds: Speeds
    slo: Slo
    policy: PlannerPolicy
    batch: Load | None = None  # batch lines due, at the lowest priority
    min_decode: int = 0  # fewer decode workers are not candidates (KV short)

    def predict(self, fleet: Fleet) -> Prediction:
        return predict(fleet, self.load, self.speeds, self.slo, self.policy.prices, self.batch)

    def candidates(self) -> list[Prediction]:
        policy = self.policy
        every = [f for f in fleets(policy.min_workers, policy.max_workers)
                 if policy.prices.of(f) <= policy.budget_usd_per_hour]  # fmt: skip
        if not every:
            raise ValueError("the budget buys fewer than min_workers workers")
        # A floor no fleet in the bounds reaches is dropped: the bounds come first.
        floored = [f for f in every if f.decode >= self.min_decode] or every
        return [self.predict(f) for f in floored]

    def cheapest(self) -> Prediction:
        candidates = self.candidates()
        meeting = [p for p in candidates if p.meets(self.slo)]
        if meeting:
            return min(meeting, key=lambda p: (p.usd_per_hour, -p.attainment))
        return max(candidates, key=lambda p: (p.batch_keeps_pace, p.attainment,
                                              -p.usd_per_hour))  # fmt: skip

    def at(self, factor: float) -> _Question:
        return replace(self, load=self.load.scaled(factor))


def plan(
    current: Fleet, load: Load, *, trend_per_s2: float, speeds: Speeds, slo: Slo,
    policy: PlannerPolicy, now_s: float, last_change_s: float | None,
    pressure: Pressure | None = None,
) -> Decision:  # fmt: skip
    """The fleet to run next; ``current`` counts workers still starting (already paid)."""
    pressure = pressure or Pressure()
    backlog = pressure.waiting_requests / policy.lead_s if policy.lead_s > 0 else 0.0
    ahead = load.rate_per_s + max(0.0, trend_per_s2) * policy.lead_s + backlog
    forecast = load.scaled(ahead / load.rate_per_s) if load.rate_per_s > 0 else load
    batch = pressure.batch
    if batch is not None:
        batch = batch.scaled(policy.batch_pace_margin)
    short = pressure.kv_short(policy.kv_usage_high)
    # The model saw room for the decode batch, but the engines ran out of KV: trust them.
    # Never fewer decode workers then (and one more below, where a fleet meets the SLO).
    ask = _Question(load=forecast, speeds=speeds, slo=slo, policy=policy, batch=batch,
                    min_decode=current.decode if short else 0)  # fmt: skip
    # Out of reach (prompts too long for the TTFT SLO cap every fleet's attainment): aim
    # a hair under the best fleet's, so that the usual rules (and hysteresis) still hold.
    ceiling = max(p.attainment for p in ask.candidates())
    capped = slo.attainment > ceiling - policy.ceiling_tolerance
    if capped:
        aim = max(0.0, ceiling - policy.ceiling_tolerance)
        ask = replace(ask, slo=replace(slo, attainment=aim))
    now = ask.predict(current)
    best = ask.cheapest()
    rate = f"{forecast.rate_per_s:.2f} req/s"
    if backlog:
        rate += f" ({pressure.waiting_requests:.0f} waiting)"
    if batch is not None:
        rate += f" and {batch.rate_per_s:.2f} batch lines/s"

    def decide(fleet: Fleet, prediction: Prediction, reason: str) -> Decision:
        if capped:
            reason = _out_of_reach(reason, ceiling)
        return Decision(fleet=fleet, current=current, reason=reason, forecast_rate_per_s=ahead,
                        prediction=prediction, current_prediction=now)  # fmt: skip

    if not now.meets(ask.slo):
        why = "its batch lines would fall behind" if not now.batch_keeps_pace else (
            f"would meet the SLO for {now.attainment:.0%} of requests")  # fmt: skip
        return decide(best.fleet, best, f"{current} {why} at {rate}; {best.fleet} is the "
                      f"cheapest at {best.attainment:.0%}")  # fmt: skip
    # One more decode worker at a time: the last change's workers serve after
    # change_cost_s, and until then the engines' KV says nothing about them.
    settling = last_change_s is not None and now_s - last_change_s < policy.change_cost_s
    if short and not settling:
        more = replace(ask, min_decode=current.decode + 1).cheapest()
        if more.fleet.decode > current.decode and more.meets(ask.slo):
            return decide(more.fleet, more, f"decode is short of KV at {rate} "
                          f"({pressure.describe_kv()}); {more.fleet} is the cheapest with more "
                          f"decode ({more.attainment:.0%})")  # fmt: skip
    if best.usd_per_hour >= now.usd_per_hour:
        return decide(current, now, f"{current} meets the SLO at {rate} "
                      f"({now.attainment:.0%}) and nothing cheaper does")  # fmt: skip
    fleet, prediction, reason = _cheaper_if_worth_it(
        current, now, ask, since_change_s=None if last_change_s is None else now_s - last_change_s,
    )  # fmt: skip
    return decide(fleet, prediction, reason)


def _out_of_reach(reason: str, ceiling: float) -> str:
    return f"no fleet within bounds and budget meets the target (best {ceiling:.0%}): {reason}"


def _cheaper_if_worth_it(
    current: Fleet, now: Prediction, ask: _Question, *, since_change_s: float | None
) -> tuple[Fleet, Prediction, str]:
    """Scale down, or re-split for less, only with margin, spacing and payback."""
    policy, slo = ask.policy, ask.slo
    rate = f"{ask.load.rate_per_s:.2f} req/s"
    safe = ask.at(1 + policy.scale_down_margin).cheapest()
    if not safe.meets(slo) or safe.usd_per_hour >= now.usd_per_hour:
        return current, now, (f"{current} meets the SLO at {rate}; nothing cheaper would at "
                              f"{policy.scale_down_margin:.0%} more load")  # fmt: skip
    if since_change_s is not None and since_change_s < policy.min_change_interval_s:
        return (
            current,
            now,
            (
                f"{safe.fleet} would be cheaper, but the last change was {since_change_s:.0f}s ago "
                f"(min {policy.min_change_interval_s:.0f}s)"
            ),
        )
    saved = (now.usd_per_hour - safe.usd_per_hour) * policy.payback_s / 3600
    cost = policy.prices.of(moved_workers(current, safe.fleet)) * policy.change_cost_s / 3600
    if saved <= cost:
        return current, now, (f"{safe.fleet} would save ${saved:.2f} over {policy.payback_s:.0f}s, "
                              f"less than the change costs (${cost:.2f})")  # fmt: skip
    predicted = ask.predict(safe.fleet)
    return (
        safe.fleet,
        predicted,
        (
            f"{safe.fleet} meets the SLO at {rate} ({predicted.attainment:.0%}, and at "
            f"{policy.scale_down_margin:.0%} more load) for ${safe.usd_per_hour:.2f}/h instead of "
            f"${now.usd_per_hour:.2f}/h"
        ),
    )


class Planner:
    """``plan`` each interval over a ``PlannerWindow``, corrected by what was measured."""

    def __init__(self, *, window: PlannerWindow, slo: Slo, policy: PlannerPolicy) -> None:
        self.window = window
        self._slo = slo
        self.policy = policy  # replaceable between steps (a new price, say)
        self.last_change_s: float | None = None
        self.shortfall = 0.0
        self.last: Decision | None = None

    def __repr__(self) -> str:
        return f"Planner(shortfall={self.shortfall:.3f}, last_change_s={self.last_change_s})"

    def step(self, sample: IntervalSample, current: Fleet, *, settled: bool) -> Decision | None:
        """One interval: ``current`` counts starting workers; ``settled``: no worker
        started, stopped or changed role during the interval. None: nothing to plan on."""
        self.window.add(sample)
        load = self.window.load()
        if load is None or load.rate_per_s <= 0:
            return None
        speeds = self.window.speeds()
        if settled and sample.lengths:
            predicted = predict(current, load, speeds, self._slo, 0.0).attainment
            measured = sample.met_slo / len(sample.lengths)
            decay = self.policy.correction_decay
            self.shortfall = decay * self.shortfall + (1 - decay) * (predicted - measured)
        correction = min(self.policy.max_correction, max(0.0, self.shortfall))
        slo = replace(self._slo, attainment=min(0.999, self._slo.attainment + correction))
        decision = plan(current, load, trend_per_s2=self.window.trend_per_s2(), speeds=speeds,
                        slo=slo, policy=self.policy, now_s=sample.end_s,
                        last_change_s=self.last_change_s, pressure=sample.pressure)  # fmt: skip
        if decision.changes:
            self.last_change_s = sample.end_s
        self.last = decision
        return decision
