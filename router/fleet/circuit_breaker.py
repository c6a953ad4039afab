"""One worker's circuit breaker: requests that keep failing take it out of rotation,
and a trial request brings it back.

A worker whose engine answers ``/health`` but fails every request (a wedged NIXL agent
after its peer restarted, an engine that 500s) would otherwise be put back by each
passing probe and fail the next request, forever. The breaker's states, at ``now_s``:

- closed: traffic flows. ``failures_to_open`` failed requests in a row open it; one
  that could not reach the engine at all opens it at once;
- open: no traffic until ``open_s`` have passed since it opened. The wait doubles each
  time a trial fails, up to ``max_open_s``, and starts again at ``open_s`` once a trial
  succeeds;
- half-open: the wait is over. Traffic flows again, but only while the router's latest
  health probe of the engine passed (the caller says whether it did): the next success
  closes the breaker, the next failure opens it again for twice as long.

A result that arrives while the breaker is open (a request that started before it
opened) changes nothing. Pure state: the clock is a parameter.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(slots=True)
class CircuitBreaker:
    failures_to_open: int = 3
    open_s: float = 5.0
    max_open_s: float = 60.0
    failures: int = 0  # failed requests in a row
    opened_at_s: float | None = None  # None: closed
    open_for_s: float = 0.0
    trips: int = 0  # times it opened

    def state(self, now_s: float) -> CircuitState:
        if self.opened_at_s is None:
            return CircuitState.CLOSED
        if now_s < self.opened_at_s + self.open_for_s:
            return CircuitState.OPEN
        return CircuitState.HALF_OPEN

    def allows(self, now_s: float, *, probe_passed: bool) -> bool:
        state = self.state(now_s)
        return state is CircuitState.CLOSED or (state is CircuitState.HALF_OPEN and probe_passed)

    def failed(self, now_s: float, *, at_once: bool = False) -> bool:
        """A request to the worker failed; True if that opened the breaker."""
        state = self.state(now_s)
        if state is CircuitState.OPEN:
            return False
        self.failures += 1
        if state is CircuitState.CLOSED and not at_once and self.failures < self.failures_to_open:
            return False
        if state is CircuitState.HALF_OPEN:
            self.open_for_s = min(self.max_open_s, self.open_for_s * 2)
        else:
            self.open_for_s = self.open_s
        self.opened_at_s = now_s
        self.trips += 1
        return True

    def succeeded(self, now_s: float) -> bool:
        """A request to the worker succeeded; True if that closed the breaker."""
        state = self.state(now_s)
        if state is CircuitState.OPEN:
            return False
        self.failures = 0
        if state is CircuitState.CLOSED:
            return False
        self.opened_at_s, self.open_for_s = None, 0.0
        return True
