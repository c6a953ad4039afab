"""Batches in the control state: one document per batch, an index of their ids, and
the lease that lets one replica at a time run a batch.

Invariants:
- every change to a batch is a compare-and-set on its document (``change``): two
  replicas (a runner and a cancel, two runners) never lose each other's writes;
- a batch is run only by the holder of an unexpired lease (``take_lease``); a holder
  renews it while it runs, and a replica that dies lets it lapse, so another takes
  the batch over within ``lease_s``;
- the index holds at most ``max_batches`` ids: a new batch pushes out the oldest
  ended one (its document and kept lines with it); with none ended, it is refused.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel

from contracts.batch import ENDED, Batch
from router.state.base import ControlState, StateConflict

_INDEX = "batches"
_TRIES = 20  # compare-and-set retries before a change gives up (a hot document)


class PendingLines(BaseModel):
    """A running batch's lines of one model not yet answered, and their tokens: prompt
    (estimated, 4 characters a token) and output (max_tokens)."""

    lines: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0


class BatchProgress(BaseModel):
    """How a running batch is doing, as its runner last published it (every second)."""

    lines_per_s: float = 0.0  # lines answered per second, over the last minute
    # Its lines not yet answered: prompt (estimated, 4 characters a token) and max_tokens.
    backlog_tokens: int = 0
    pending: dict[str, PendingLines] = {}  # by model (the SLO planner plans for them)
    seconds_left: float | None = None  # until its completion window ends
    in_flight: int = 0
    pace_limit: int = 0  # lines its pacing lets be in flight now (``pacing.py``)


class BatchRecord(BaseModel):
    batch: Batch
    owner: str | None = None  # the replica whose runner holds the lease
    lease_until_unix_s: float = 0.0
    # At its pace so far it would not finish before it expires (``runner.at_risk``).
    at_risk: bool = False
    progress: BatchProgress | None = None


class TooManyBatches(RuntimeError):
    """``max_batches`` batches are kept and none has ended."""


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def _document(batch_id: str) -> str:
    return f"batch/{batch_id}"


class BatchBook:
    def __init__(
        self, state: ControlState, *, max_batches: int, wall_clock: Callable[[], float]
    ) -> None:
        self._state = state
        self._max = max_batches
        self._now = wall_clock

    def __repr__(self) -> str:
        return f"BatchBook(max_batches={self._max})"

    async def create(self, batch: Batch) -> None:
        await self._state.put_document(
            _document(batch.id), BatchRecord(batch=batch).model_dump(mode="json"),
            expected_version=0,
        )  # fmt: skip
        for _ in range(_TRIES):
            found = await self._state.document(_INDEX)
            version, index = found if found else (0, {"ids": []})
            ids = [*index["ids"], batch.id]
            while len(ids) > self._max:
                ids.remove(await self._oldest_ended(ids, batch.id))
            try:
                await self._state.put_document(_INDEX, {"ids": ids}, expected_version=version)
                return
            except StateConflict:
                continue
        raise StateConflict("the batch index kept changing")

    async def _oldest_ended(self, ids: list[str], keep: str) -> str:
        for batch_id in ids:
            record = await self.get(batch_id)
            if batch_id != keep and (record is None or record.batch.status in ENDED):
                await self._state.delete_document(_document(batch_id))
                await self._state.drop_batch_lines(batch_id)
                return batch_id
        await self._state.delete_document(_document(keep))
        raise TooManyBatches(f"{self._max} batches are kept and none has ended (max_batches)")

    async def get(self, batch_id: str) -> BatchRecord | None:
        found = await self._state.document(_document(batch_id))
        return None if found is None else BatchRecord.model_validate(found[1])

    async def ids(self) -> list[str]:
        found = await self._state.document(_INDEX)
        return list(found[1]["ids"]) if found else []

    async def records(self, *, newest_first: bool = False) -> AsyncIterator[BatchRecord]:
        """Every kept batch's record, in the index's order (oldest first) or reversed;
        one that vanished meanwhile (pushed out) is skipped."""
        ids = await self.ids()
        for batch_id in reversed(ids) if newest_first else ids:
            record = await self.get(batch_id)
            if record is not None:
                yield record

    async def count_by_status(self, *, newest: int) -> dict[str, int]:
        """How many of the newest ``newest`` batches are in each status."""
        counts: dict[str, int] = {}
        seen = 0
        async for record in self.records(newest_first=True):
            counts[record.batch.status] = counts.get(record.batch.status, 0) + 1
            seen += 1
            if seen >= newest:
                break
        return counts

    async def change(
        self, batch_id: str, edit: Callable[[BatchRecord], BatchRecord | None]
    ) -> BatchRecord | None:
        """Apply ``edit`` to the batch's current record and store it, retrying on a
        concurrent write; ``edit`` returning None leaves the record as it is."""
        for _ in range(_TRIES):
            found = await self._state.document(_document(batch_id))
            if found is None:
                return None
            version, raw = found
            edited = edit(BatchRecord.model_validate(raw))
            if edited is None:
                return BatchRecord.model_validate(raw)
            try:
                await self._state.put_document(
                    _document(batch_id), edited.model_dump(mode="json"), expected_version=version
                )
            except StateConflict:
                continue
            return edited
        raise StateConflict(f"batch {batch_id} kept changing")

    async def take_lease(self, batch_id: str, owner: str, lease_s: float) -> bool:
        """Hold (or renew) the batch's lease; False when another replica holds it."""
        now = self._now()

        def take(record: BatchRecord) -> BatchRecord | None:
            if record.owner not in (None, owner) and record.lease_until_unix_s > now:
                return None
            return record.model_copy(update={"owner": owner, "lease_until_unix_s": now + lease_s})

        record = await self.change(batch_id, take)
        return record is not None and record.owner == owner and record.lease_until_unix_s > now
