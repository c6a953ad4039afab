"""The control plane's shared state: one interface, two backends (memory, Redis).

What it holds:
- worker records (the registration and latest heartbeat as JSON), each with a TTL that a
  heartbeat renews: a worker whose agent stops reporting disappears by itself;
- pool targets: per model, how many prefill and decode workers the SRE asked for;
- config documents by name, each write a new version;
- an append-only audit log, capped at ``max_audit_entries`` (oldest dropped first);
- the reviewer's queue of flagged requests, capped at ``max_review_items`` (oldest
  dropped first); an item's prompt text, when a policy keeps it, expires on its own;
- token buckets for tenants' rates (``token_bucket``): shared by replicas with Redis;
- each batch's finished lines, keyed by ``custom_id``: a line's outcome is recorded once
  (the first record wins), whichever replica ran it.

Invariants:
- every write is announced to every ``subscribe()``r, on every replica (this one included), so a
  replica's view converges without polling; a replica that missed announcements (a
  reconnect) re-reads everything, because a ``Change`` only names what to re-read;
- nothing a replica holds locally is authoritative: any replica can be killed and another
  rebuilds the same view from the backend;
- bounded: ``max_workers`` records, ``max_audit_entries`` audit entries, documents under
  ``max_document_bytes``, a batch line's outcome under ``max_batch_line_bytes`` (how many
  lines and batches: the batch tier's own caps).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from router.admission.token_bucket import BucketRate

ChangeKind = Literal["worker", "targets", "config", "resync"]


class StateFull(RuntimeError):
    """A bound was reached (workers, or a document's size)."""


class StateUnavailable(RuntimeError):
    """The backend cannot be reached; callers keep their last good view."""


class StateConflict(RuntimeError):
    """A document changed since the caller read it (``put_document(expected_version=)``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StateLimits:
    max_workers: int = 1024
    max_audit_entries: int = 10_000
    max_document_bytes: int = 256 * 1024
    max_review_items: int = 10_000
    # Memory backend only (Redis expires a bucket once it would be full again).
    max_buckets: int = 100_000
    max_batch_line_bytes: int = 1024 * 1024


DEFAULT_LIMITS = StateLimits()


@dataclass(frozen=True, slots=True)
class PoolTargets:
    prefill: int
    decode: int

    def as_dict(self) -> dict[str, int]:
        return {"prefill": self.prefill, "decode": self.decode}


@dataclass(frozen=True, slots=True)
class Change:
    """What changed; readers re-read it (``resync``: re-read everything)."""

    kind: ChangeKind
    key: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    at_unix_s: float
    actor: str  # the token's name, never the token
    action: str
    target: str
    outcome: str
    detail: dict[str, Any]


class ControlState(abc.ABC):
    limits: StateLimits

    @abc.abstractmethod
    async def put_worker(self, worker_id: str, record: dict[str, Any], *, ttl_s: float) -> None:
        """Create or renew a worker record; it vanishes ``ttl_s`` after the last put."""

    @abc.abstractmethod
    async def remove_worker(self, worker_id: str) -> bool: ...

    @abc.abstractmethod
    async def worker(self, worker_id: str) -> dict[str, Any] | None:
        """One live record, or None (never registered, removed or expired)."""

    @abc.abstractmethod
    async def workers(self) -> dict[str, dict[str, Any]]:
        """Every live record by worker id."""

    @abc.abstractmethod
    async def set_targets(self, model: str, targets: PoolTargets) -> None: ...

    @abc.abstractmethod
    async def targets(self) -> dict[str, PoolTargets]: ...

    @abc.abstractmethod
    async def put_document(
        self, name: str, value: dict[str, Any], *, expected_version: int | None = None
    ) -> int:
        """Store a config document whole; returns its new version (1, 2, ...). With
        ``expected_version`` (0: absent), raise ``StateConflict`` unless the stored
        version is that one, atomically across replicas."""

    @abc.abstractmethod
    async def document(self, name: str) -> tuple[int, dict[str, Any]] | None: ...

    @abc.abstractmethod
    async def delete_document(self, name: str) -> bool: ...

    @abc.abstractmethod
    async def append_audit(self, entry: AuditEntry) -> None: ...

    @abc.abstractmethod
    async def audit(self, *, limit: int = 100) -> list[AuditEntry]:
        """The newest ``limit`` entries, oldest first."""

    @abc.abstractmethod
    async def add_review(
        self, item: dict[str, Any], *, text: str | None, text_ttl_s: float
    ) -> None:
        """Queue a flagged item (its ``id`` unique); ``text`` is kept ``text_ttl_s``."""

    @abc.abstractmethod
    async def review_items(self, *, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` items, oldest first; ``text`` on those still keeping it."""

    @abc.abstractmethod
    async def update_review(self, item_id: str, changes: dict[str, Any]) -> dict[str, Any] | None:
        """Merge ``changes`` into an item; None when it is unknown (or dropped)."""

    @abc.abstractmethod
    async def take_tokens(self, bucket: str, cost: float, rate: BucketRate) -> float:
        """Take ``cost`` from the named bucket: 0.0 when taken, else the seconds until it
        could be (nothing taken). Atomic across replicas."""

    @abc.abstractmethod
    async def record_batch_line(self, batch_id: str, custom_id: str, outcome: str) -> bool:
        """Keep a batch line's outcome unless one is kept already; True when this call
        kept it. Atomic across replicas. ``StateFull`` past ``max_batch_line_bytes``."""

    @abc.abstractmethod
    async def batch_lines(self, batch_id: str) -> dict[str, str]:
        """Every kept outcome of the batch, by custom_id."""

    @abc.abstractmethod
    async def drop_batch_lines(self, batch_id: str) -> None: ...

    @abc.abstractmethod
    async def subscribe(self) -> AsyncIterator[Change]:
        """Announcements of every write, from every replica, until ``close``: subscribed
        when this returns, so a write made after it is never missed."""

    @abc.abstractmethod
    async def close(self) -> None: ...


def check_batch_line(outcome: str, limits: StateLimits) -> None:
    if len(outcome.encode()) > limits.max_batch_line_bytes:
        raise StateFull(f"a batch line's outcome is over {limits.max_batch_line_bytes} bytes")
