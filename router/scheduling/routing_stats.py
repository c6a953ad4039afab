"""What routing decided, for the metrics: per worker and per pool.

The scheduler and the KV event feed write here. Each routed request goes on to
``on_routed`` (the metrics' counters, which add up over router processes); the recent
choices (hotspots) and KV event counts are read through ``snapshot()`` at scrape time.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from contracts.workers import WorkerRole


@dataclass(frozen=True, slots=True)
class RoutingSnapshot:
    kv_event_batches: dict[tuple[str, str], int] = field(default_factory=dict)
    recent_choices: dict[WorkerRole, tuple[str, ...]] = field(default_factory=dict)

    def hotspot_factor(self, role: WorkerRole, workers: int) -> float | None:
        """Workers x the largest share of the recent decisions; 1.0 is perfectly even."""
        recent = self.recent_choices.get(role)
        if not recent or workers < 1:
            return None
        return workers * max(Counter(recent).values()) / len(recent)


class RoutingStats:
    def __init__(
        self,
        *,
        hotspot_window_requests: int,
        on_routed: Callable[[str, str, int | None, int], None] = lambda *_: None,
    ) -> None:
        self._window = hotspot_window_requests
        self._on_routed = on_routed
        self._events: Counter[tuple[str, str]] = Counter()
        self._recent: dict[WorkerRole, deque[str]] = {}

    def chosen(self, role: WorkerRole, worker_id: str) -> None:
        recent = self._recent.get(role)
        if recent is None:
            recent = self._recent[role] = deque(maxlen=self._window)
        recent.append(worker_id)

    def routed(
        self, worker_id: str, role: WorkerRole, prompt_tokens: int | None, uncached_tokens: int
    ) -> None:
        """A request was sent; ``prompt_tokens`` is None when no decision scored it."""
        self._on_routed(worker_id, role.value, prompt_tokens, uncached_tokens)

    def kv_event(self, worker_id: str, kind: str) -> None:
        self._events[(worker_id, kind)] += 1

    def forget(self, worker_id: str) -> None:
        for key in [k for k in self._events if k[0] == worker_id]:
            del self._events[key]

    def snapshot(self) -> RoutingSnapshot:
        recent = {role: tuple(choices) for role, choices in self._recent.items()}
        return RoutingSnapshot(dict(self._events), recent)
