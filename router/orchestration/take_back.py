"""Batch lines' prefills that an interactive prompt takes back from a worker.

An engine that schedules by priority orders only what waits: a prefill already running
keeps its part of every step until it ends (vLLM's scheduler preempts for KV blocks,
never for the token budget). A batch line sent to a spare prefill worker therefore
lengthens the steps of an interactive prompt sent there after it. With
``batch_prefill_take_back`` (off by default), when a prompt that does not yield is sent
to a worker, the router takes back the batch prefills under way there: their engine
calls are cancelled, which aborts them in the engine (vLLM aborts a request whose client
left; so does the sim), and each line goes back to its batch's runner as a yield (429
``batch_yields``), to be sent again when there is room. Its full blocks stay in the
engine's prefix cache. It cannot shorten the step under way; with one-step batch lines
it trades the batch's pace for interactive TTFT as a smaller ``batch_prefill_share``
does (docs/benchmarks.md, batch lab notes, item 9).

Invariants:
- A hold is known only while its engine call is under way (``hold`` is a context
  manager); a worker's holds are forgotten once it has none. So the holds are at most
  the batch lines in flight (``batch_max_in_flight`` a batch).
- ``take_back`` sets each hold at that worker once and forgets them; a line sent there
  after it is not taken back until another prompt comes.
- A taken-back call is cancelled and awaited before ``TakenBack`` is raised, so its
  connection is closed (the engine's abort) before the line's ticket ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from typing import TypeVar

from router.cancellation import unless

T = TypeVar("T")


class TakenBack(Exception):
    """A batch line's prefill was taken back for an interactive prompt."""


class BatchPrefillHolds:
    def __init__(self) -> None:
        self._by_worker: dict[str, set[asyncio.Event]] = {}

    def __repr__(self) -> str:
        return f"BatchPrefillHolds(workers={len(self._by_worker)})"

    @contextlib.contextmanager
    def hold(self, worker_id: str) -> Iterator[asyncio.Event]:
        """While the line's prefill call runs at ``worker_id``: the event is set when an
        interactive prompt takes the worker back."""
        taken = asyncio.Event()
        holds = self._by_worker.setdefault(worker_id, set())
        holds.add(taken)
        try:
            yield taken
        finally:
            holds.discard(taken)
            if not holds and self._by_worker.get(worker_id) is holds:
                del self._by_worker[worker_id]

    def take_back(self, worker_id: str) -> int:
        """Take back every batch prefill under way at the worker; how many there were."""
        holds = self._by_worker.pop(worker_id, set())
        for taken in holds:
            taken.set()
        return len(holds)

    def held(self, worker_id: str) -> int:
        return len(self._by_worker.get(worker_id, ()))


async def unless_taken_back(work: Awaitable[T], taken: asyncio.Event) -> T:
    """``work``'s result; if ``taken`` is set first, ``work`` is cancelled (and awaited)
    and ``TakenBack`` raised."""
    return await unless(work, taken.wait(), TakenBack)
