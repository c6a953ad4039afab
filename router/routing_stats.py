"""What routing decided, counted for the metrics: per worker and per pool.

The scheduler and the KV event feed write here; ``metrics.py`` reads ``snapshot()``
at scrape time and never the counters themselves.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from contracts.workers import WorkerRole


@dataclass(frozen=True, slots=True)
class WorkerRouting:
    routed_requests: int = 0
    routed_prompt_tokens: int = 0
    predicted_hit_tokens: int = 0

    @property
    def predicted_hit_ratio(self) -> float | None:
        if not self.routed_prompt_tokens:
            return None
        return self.predicted_hit_tokens / self.routed_prompt_tokens


@dataclass(frozen=True, slots=True)
class RoutingSnapshot:
    workers: dict[str, WorkerRouting] = field(default_factory=dict)
    kv_event_batches: dict[tuple[str, str], int] = field(default_factory=dict)
    recent_choices: dict[WorkerRole, tuple[str, ...]] = field(default_factory=dict)

    def hotspot_factor(self, role: WorkerRole, workers: int) -> float | None:
        """Workers x the largest share of the recent decisions; 1.0 is perfectly even."""
        recent = self.recent_choices.get(role)
        if not recent or workers < 1:
            return None
        return workers * max(Counter(recent).values()) / len(recent)


class RoutingStats:
    def __init__(self, *, hotspot_window_requests: int) -> None:
        self._window = hotspot_window_requests
        self._requests: Counter[str] = Counter()
        self._prompt_tokens: Counter[str] = Counter()
        self._hit_tokens: Counter[str] = Counter()
        self._events: Counter[tuple[str, str]] = Counter()
        self._recent: dict[WorkerRole, deque[str]] = {}

    def chosen(self, role: WorkerRole, worker_id: str) -> None:
        recent = self._recent.get(role)
        if recent is None:
            recent = self._recent[role] = deque(maxlen=self._window)
        recent.append(worker_id)

    def routed(self, worker_id: str, prompt_tokens: int | None, uncached_tokens: int) -> None:
        """A request was sent; ``prompt_tokens`` is None when no decision scored it."""
        self._requests[worker_id] += 1
        if prompt_tokens is not None:
            self._prompt_tokens[worker_id] += prompt_tokens
            self._hit_tokens[worker_id] += prompt_tokens - uncached_tokens

    def kv_event(self, worker_id: str, kind: str) -> None:
        self._events[(worker_id, kind)] += 1

    def forget(self, worker_id: str) -> None:
        for counter in (self._requests, self._prompt_tokens, self._hit_tokens):
            counter.pop(worker_id, None)
        for key in [k for k in self._events if k[0] == worker_id]:
            del self._events[key]

    def snapshot(self) -> RoutingSnapshot:
        workers = {
            w: WorkerRouting(count, self._prompt_tokens[w], self._hit_tokens[w])
            for w, count in self._requests.items()
        }
        recent = {role: tuple(choices) for role, choices in self._recent.items()}
        return RoutingSnapshot(workers, dict(self._events), recent)
