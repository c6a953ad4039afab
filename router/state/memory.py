"""The in-memory backend: the embedded default for a single router (nothing shared)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from router.admission.token_bucket import BucketLevel, BucketRate, take
from router.state.base import (
    DEFAULT_LIMITS,
    AuditEntry,
    Change,
    ControlState,
    PoolTargets,
    StateConflict,
    StateFull,
    StateLimits,
    check_batch_line,
)

_SUBSCRIBER_QUEUE = 1024  # announcements a slow reader may lag by before it must resync


class MemoryState(ControlState):
    def __init__(
        self, limits: StateLimits = DEFAULT_LIMITS, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._workers: dict[str, tuple[float, dict[str, Any]]] = {}  # id -> (expires, record)
        self._targets: dict[str, PoolTargets] = {}
        self._documents: dict[str, tuple[int, dict[str, Any]]] = {}
        self._audit: deque[AuditEntry] = deque(maxlen=limits.max_audit_entries)
        self._review: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._review_text: dict[str, tuple[float, str]] = {}  # id -> (expires, text)
        self._subscribers: list[asyncio.Queue[Change | None]] = []
        # Least recently used first; dropping one that is not yet full lets its tenant
        # burst early, which only happens past max_buckets live tenants.
        self._buckets: OrderedDict[str, BucketLevel] = OrderedDict()
        self._batch_lines: dict[str, dict[str, str]] = {}

    def __repr__(self) -> str:
        return f"MemoryState(workers={len(self._workers)}, models={sorted(self._targets)})"

    async def put_worker(self, worker_id: str, record: dict[str, Any], *, ttl_s: float) -> None:
        self._expire()
        if worker_id not in self._workers and len(self._workers) >= self.limits.max_workers:
            raise StateFull(f"{self.limits.max_workers} workers registered (max_workers)")
        _check_size(record, self.limits)
        self._workers[worker_id] = (self._clock() + ttl_s, record)
        self._announce(Change("worker", worker_id))

    async def remove_worker(self, worker_id: str) -> bool:
        removed = self._workers.pop(worker_id, None) is not None
        if removed:
            self._announce(Change("worker", worker_id))
        return removed

    async def worker(self, worker_id: str) -> dict[str, Any] | None:
        self._expire()
        entry = self._workers.get(worker_id)
        return None if entry is None else entry[1]

    async def workers(self) -> dict[str, dict[str, Any]]:
        self._expire()
        return {worker_id: record for worker_id, (_, record) in self._workers.items()}

    async def set_targets(self, model: str, targets: PoolTargets) -> None:
        self._targets[model] = targets
        self._announce(Change("targets", model))

    async def targets(self) -> dict[str, PoolTargets]:
        return dict(self._targets)

    async def put_document(
        self, name: str, value: dict[str, Any], *, expected_version: int | None = None
    ) -> int:
        _check_size(value, self.limits)
        current = self._documents.get(name, (0, {}))[0]
        if expected_version is not None and current != expected_version:
            raise StateConflict(f"{name} is at version {current}, not {expected_version}")
        version = current + 1
        self._documents[name] = (version, json.loads(json.dumps(value)))  # a copy, as stored
        self._announce(Change("config", name))
        return version

    async def document(self, name: str) -> tuple[int, dict[str, Any]] | None:
        return self._documents.get(name)

    async def delete_document(self, name: str) -> bool:
        return self._documents.pop(name, None) is not None

    async def append_audit(self, entry: AuditEntry) -> None:
        self._audit.append(entry)

    async def audit(self, *, limit: int = 100) -> list[AuditEntry]:
        return list(self._audit)[-limit:] if limit > 0 else []

    async def add_review(
        self, item: dict[str, Any], *, text: str | None, text_ttl_s: float
    ) -> None:
        self._review[item["id"]] = json.loads(json.dumps(item))
        if text is not None:
            self._review_text[item["id"]] = (self._clock() + text_ttl_s, text)
        while len(self._review) > self.limits.max_review_items:
            dropped, _ = self._review.popitem(last=False)
            self._review_text.pop(dropped, None)

    async def review_items(self, *, limit: int) -> list[dict[str, Any]]:
        now = self._clock()
        for item_id in [i for i, (expires, _) in self._review_text.items() if expires <= now]:
            del self._review_text[item_id]
        newest = list(self._review.values())[-limit:] if limit > 0 else []
        return [
            {**item, "text": self._review_text[item["id"]][1]}
            if item["id"] in self._review_text else dict(item)
            for item in newest
        ]  # fmt: skip

    async def update_review(self, item_id: str, changes: dict[str, Any]) -> dict[str, Any] | None:
        item = self._review.get(item_id)
        if item is None:
            return None
        item.update(json.loads(json.dumps(changes)))
        return dict(item)

    async def take_tokens(self, bucket: str, cost: float, rate: BucketRate) -> float:
        level, wait_s = take(self._buckets.pop(bucket, None), cost, rate, self._clock())
        self._buckets[bucket] = level
        if len(self._buckets) > self.limits.max_buckets:
            self._buckets.popitem(last=False)
        return wait_s

    async def record_batch_line(self, batch_id: str, custom_id: str, outcome: str) -> bool:
        check_batch_line(outcome, self.limits)
        lines = self._batch_lines.setdefault(batch_id, {})
        if custom_id in lines:
            return False
        lines[custom_id] = outcome
        return True

    async def batch_lines(self, batch_id: str) -> dict[str, str]:
        return dict(self._batch_lines.get(batch_id, {}))

    async def drop_batch_lines(self, batch_id: str) -> None:
        self._batch_lines.pop(batch_id, None)

    async def subscribe(self) -> AsyncIterator[Change]:
        queue: asyncio.Queue[Change | None] = asyncio.Queue(_SUBSCRIBER_QUEUE)
        self._subscribers.append(queue)
        return self._follow(queue)

    async def _follow(self, queue: asyncio.Queue[Change | None]) -> AsyncIterator[Change]:
        try:
            while (change := await queue.get()) is not None:
                yield change
        finally:
            self._subscribers.remove(queue)

    async def close(self) -> None:
        for queue in self._subscribers:
            _offer(queue, None, force=True)

    def _announce(self, change: Change) -> None:
        for queue in self._subscribers:
            _offer(queue, change)

    def _expire(self) -> None:
        now = self._clock()
        for worker_id in [w for w, (expires, _) in self._workers.items() if expires <= now]:
            del self._workers[worker_id]
            self._announce(Change("worker", worker_id))


def _offer(queue: asyncio.Queue[Change | None], change: Change | None, force: bool = False) -> None:
    """Queue ``change``; a full queue is emptied for one ``resync``, which covers everything."""
    if queue.full():
        while not queue.empty():
            queue.get_nowait()
        if not force:
            change = Change("resync")
    queue.put_nowait(change)


def _check_size(value: dict[str, Any], limits: StateLimits) -> None:
    size = len(json.dumps(value))
    if size > limits.max_document_bytes:
        raise StateFull(f"{size} bytes is over max_document_bytes={limits.max_document_bytes}")
