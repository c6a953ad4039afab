"""Arrivals that come at once: the clumps the SLO planner's model needs.

A burst of requests (a client firing many at once) queues on itself: the first ``P``
start, the next ``P`` wait a round of prefill, and so on, whatever the fleet's load. The
planner's model counts that (``planner_model.Load.clump_sizes``) when it knows the
clumps' sizes; ``/metrics`` counts requests, not their gaps, so each router process
groups its own arrivals of a model: an arrival within ``window_s`` of the previous one
joins its clump; a later one closes it, and its size is reported then.

Invariants: pure (times come in); one open clump per model, at most ``max_models``
models (the oldest forgotten first). Several router processes each see a share of a
burst (the kernel spreads connections), so their clumps are smaller than the burst.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Open:
    last_s: float
    size: int


class ArrivalClumps:
    def __init__(self, *, window_s: float, max_models: int = 4096) -> None:
        self._window_s = window_s
        self._max_models = max_models
        self._open: dict[str, _Open] = {}

    def __repr__(self) -> str:
        return f"ArrivalClumps(window_s={self._window_s}, open={len(self._open)})"

    def arrive(self, model: str, at_s: float) -> int | None:
        """An arrival of ``model`` at ``at_s``; the size of the clump it closed, if any."""
        clump = self._open.get(model)
        if clump is not None and at_s - clump.last_s <= self._window_s:
            clump.last_s = at_s
            clump.size += 1
            return None
        if clump is None and len(self._open) >= self._max_models:
            del self._open[next(iter(self._open))]
        self._open[model] = _Open(at_s, 1)
        return None if clump is None else clump.size
