"""In-flight load: what this router has sent to each worker and not yet seen finish.

One API: ``begin(worker, tokens, kv_tokens)`` returns a ``Ticket``; ``ticket.end()``
(idempotent, or leaving its ``with`` block) takes the load back. A relayed stream ends
its ticket in the relay's end callback, a whole answer when the call returns; a stream's
first byte ends the prefill part early (``prefilled``). Scorers and admission read
``of``; metrics read ``snapshot``. Nothing else changes the counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType


@dataclass(slots=True)
class InFlight:
    requests: int = 0
    tokens: int = 0  # uncached prompt tokens sent and not yet prefilled: the prefill queue
    kv_tokens: int = 0  # KV reserved on a decode-side worker: prompt + max output, per request


_IDLE = InFlight()


class Ticket:
    __slots__ = ("_kv_tokens", "_load", "_tokens")

    def __init__(self, load: InFlight, tokens: int, kv_tokens: int = 0) -> None:
        self._load: InFlight | None = load
        self._tokens = tokens
        self._kv_tokens = kv_tokens
        load.requests += 1
        load.tokens += tokens
        load.kv_tokens += kv_tokens

    def prefilled(self) -> None:
        """The first token came: the prompt no longer waits in the worker's prefill queue."""
        if self._load is not None:
            self._load.tokens -= self._tokens
        self._tokens = 0

    def end(self) -> None:
        if self._load is not None:
            self._load.requests -= 1
            self._load.tokens -= self._tokens
            self._load.kv_tokens -= self._kv_tokens
            self._load = None

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

    def begin(self, worker_id: str, tokens: int, kv_tokens: int = 0) -> Ticket:
        load = self._by_worker.get(worker_id)
        if load is None:
            load = self._by_worker[worker_id] = InFlight()
        return Ticket(load, tokens, kv_tokens)

    def forget(self, worker_id: str) -> None:
        """The worker left; tickets still open on it end harmlessly on a detached record."""
        self._by_worker.pop(worker_id, None)

    def snapshot(self) -> dict[str, InFlight]:
        return {
            w: InFlight(load.requests, load.tokens, load.kv_tokens)
            for w, load in self._by_worker.items()
        }
