"""Worker choice within a pool. Round-robin until cache-aware routing lands."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from router.registry import WorkerState


class RoundRobin:
    """Rotates per pool key; skips workers already tried for this request."""

    def __init__(self) -> None:
        self._cursor: dict[str, int] = {}

    def pick(
        self, pool: str, candidates: Sequence[WorkerState], exclude: Collection[str] = ()
    ) -> WorkerState | None:
        usable = [w for w in candidates if w.worker_id not in exclude]
        if not usable:
            return None
        usable.sort(key=lambda w: w.worker_id)
        index = self._cursor.get(pool, 0)
        self._cursor[pool] = index + 1
        return usable[index % len(usable)]
