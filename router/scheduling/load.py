"""In-flight load: what this router has sent to each worker and not yet seen finish.

One API: ``begin(worker, tokens, kv_tokens)`` returns a ``Ticket``; ``ticket.end()``
(idempotent, or leaving its ``with`` block) takes the load back. A relayed stream ends
its ticket in the relay's end callback, a whole answer when the call returns; a stream's
first byte ends the prefill part early (``prefilled``). Scorers and admission read
``of``; metrics read ``snapshot``. Nothing else changes the counts.

A prefill may carry a deadline (the time its prefill must end for its first token to
meet the TTFT target); ``earliest_deadline_s`` is the nearest among the worker's
prefills still under way. An engine prefills what waits in one step, so new work sent
there can push an earlier request past that deadline: admission and the scheduler
check it (``scheduling_plugins.ttft_budget``).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from types import TracebackType

_ticket_numbers = itertools.count()
_COMPACT_AT = 64  # departed deadlines kept in the heap before it is rebuilt without them


@dataclass(slots=True)
class InFlight:
    requests: int = 0
    tokens: int = 0  # uncached prompt tokens sent and not yet prefilled: the prefill queue
    kv_tokens: int = 0  # KV reserved on a decode-side worker: prompt + max output, per request
    yielding_tokens: int = 0  # of ``tokens``, batch lines' (requests that yield to the rest)
    # (deadline_s, ticket number) of prefills under way; departed ones leave lazily.
    _deadlines: list[tuple[float, int]] = field(default_factory=list, init=False, repr=False)
    _departed: set[int] = field(default_factory=set, init=False, repr=False)

    @property
    def prefills_other_work(self) -> bool:
        """Is a prefill other than a batch line's under way here?"""
        return self.tokens > self.yielding_tokens

    def earliest_deadline_s(self) -> float | None:
        heap, departed = self._deadlines, self._departed
        while heap and heap[0][1] in departed:
            departed.discard(heapq.heappop(heap)[1])
        return heap[0][0] if heap else None

    def _add_deadline(self, deadline_s: float) -> int:
        number = next(_ticket_numbers)
        heapq.heappush(self._deadlines, (deadline_s, number))
        return number

    def _drop_deadline(self, number: int) -> None:
        self._departed.add(number)
        if len(self._departed) > _COMPACT_AT and 2 * len(self._departed) > len(self._deadlines):
            self._deadlines = [d for d in self._deadlines if d[1] not in self._departed]
            heapq.heapify(self._deadlines)
            self._departed.clear()


_IDLE = InFlight()


class Ticket:
    __slots__ = ("_deadline", "_kv_tokens", "_load", "_tokens", "_yields")

    def __init__(
        self, load: InFlight, tokens: int, kv_tokens: int = 0, deadline_s: float | None = None,
        yields: bool = False,
    ) -> None:  # fmt: skip
        self._load: InFlight | None = load
        self._tokens = tokens
        self._kv_tokens = kv_tokens
        self._yields = yields
        self._deadline = None if deadline_s is None else load._add_deadline(deadline_s)
        load.requests += 1
        load.kv_tokens += kv_tokens
        self._count_tokens(load, tokens)

    def _count_tokens(self, load: InFlight, tokens: int) -> None:
        load.tokens += tokens
        if self._yields:
            load.yielding_tokens += tokens

    def prefilled(self) -> None:
        """The first token came: the prompt no longer waits in the worker's prefill queue."""
        if self._load is not None:
            self._count_tokens(self._load, -self._tokens)
            self._leave_deadline(self._load)
        self._tokens = 0

    def end(self) -> None:
        if self._load is not None:
            self._load.requests -= 1
            self._count_tokens(self._load, -self._tokens)
            self._load.kv_tokens -= self._kv_tokens
            self._leave_deadline(self._load)
            self._load = None

    def _leave_deadline(self, load: InFlight) -> None:
        if self._deadline is not None:
            load._drop_deadline(self._deadline)
            self._deadline = None

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.end()


class InFlightLoad:
    def __init__(self) -> None:
        self._by_worker: dict[str, InFlight] = {}

    def __repr__(self) -> str:
        return f"InFlightLoad(workers={len(self._by_worker)})"

    def of(self, worker_id: str) -> InFlight:
        """The worker's load now; read only (an idle worker shares one zero record)."""
        return self._by_worker.get(worker_id, _IDLE)

    def begin(
        self, worker_id: str, tokens: int, kv_tokens: int = 0, *,
        deadline_s: float | None = None, yields: bool = False,
    ) -> Ticket:  # fmt: skip
        """``deadline_s``: when this prefill must end (None: it has no deadline);
        ``yields``: a batch line's, counted in ``yielding_tokens`` too."""
        load = self._by_worker.get(worker_id)
        if load is None:
            load = self._by_worker[worker_id] = InFlight()
        return Ticket(load, tokens, kv_tokens, deadline_s, yields)

    def forget(self, worker_id: str) -> None:
        """The worker left; tickets still open on it end harmlessly on a detached record."""
        self._by_worker.pop(worker_id, None)

    def snapshot(self) -> dict[str, InFlight]:
        return {
            w: InFlight(load.requests, load.tokens, load.kv_tokens, load.yielding_tokens)
            for w, load in self._by_worker.items()
        }
