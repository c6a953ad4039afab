"""Which worker holds which KV blocks: the router's prefix index.

Blocks are named by vLLM's external 64-bit block hash (contracts.block_hashing), so
entries from KV events and entries recorded at routing time are the same keys.

Two kinds of entry, per (block, worker):
- *confirmed*: the worker's own KV events said it stored the block (precise);
  it lasts until a BlockRemoved, an AllBlocksCleared, a gap or a restart;
- *recorded*: the router sent the worker a prompt with this block, so it soon will
  (or, for an engine without events, probably still does). It expires after a TTL:
  a short one while the worker's events are flowing (it only bridges the gap
  before they arrive, so a burst of one prefix does not scatter), a long one
  otherwise (the approximate index). Recorded entries per worker are capped at the
  worker's KV capacity in blocks, oldest first out.

Invariants:
- at most ``max_blocks`` distinct blocks are held; beyond that the least recently
  used block (looked up or stored) is dropped for every worker;
- ``match`` counts, per worker, only the *leading* blocks of a prompt it holds,
  because vLLM's prefix cache can only reuse a contiguous prefix.

Pure state: no I/O, no locks (one event loop owns it), the clock is a parameter.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

CONFIRMED = float("inf")  # the expiry of an entry backed by the worker's own events


class PrefixIndex:
    def __init__(self, *, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be at least 1")
        self._max_blocks = max_blocks
        # block hash -> {worker id: expiry (CONFIRMED, or a clock time)}; LRU order.
        self._holders: OrderedDict[int, dict[str, float]] = OrderedDict()
        # Per worker, so that clearing or expiring one worker costs its own entries only.
        self._confirmed: dict[str, set[int]] = {}
        self._recorded: dict[str, OrderedDict[int, None]] = {}  # oldest first

    def __repr__(self) -> str:
        return f"PrefixIndex(blocks={len(self._holders)}, workers={len(self.workers())})"

    def __len__(self) -> int:
        return len(self._holders)

    def workers(self) -> set[str]:
        return {w for w in (*self._confirmed, *self._recorded) if self.blocks_held(w)}

    def blocks_held(self, worker_id: str) -> int:
        return len(self._confirmed.get(worker_id, ())) + len(self._recorded.get(worker_id, ()))

    def match(self, hashes: Iterable[int], now_s: float) -> dict[str, int]:
        """Per worker, how many leading blocks of ``hashes`` it holds (absent: none).

        Walks the chain once; past the first block only the workers still matching are
        checked, so a deep walk costs about one dict lookup per block."""
        matched: dict[str, int] = {}
        alive: list[str] = []  # workers that held every block so far
        holders_of = self._holders
        depth = 0
        for block_hash in hashes:
            holders = holders_of.get(block_hash)
            if not holders:
                break
            holders_of.move_to_end(block_hash)
            if depth == 0:
                alive = [w for w, expiry in holders.items() if expiry > now_s]
            elif len(alive) == 1:  # the common deep walk: one worker holds the prefix
                if holders.get(alive[0], 0.0) <= now_s:
                    matched[alive[0]] = depth
                    return matched
            else:
                here = [w for w in alive if holders.get(w, 0.0) > now_s]
                if len(here) < len(alive):
                    for dropped in alive:
                        if dropped not in here:
                            matched[dropped] = depth
                    alive = here
            if not alive:
                return matched
            depth += 1
        for worker_id in alive:
            matched[worker_id] = depth
        return matched

    def confirm(self, worker_id: str, hashes: Iterable[int]) -> None:
        """The worker's events say it stored these blocks."""
        confirmed = self._confirmed.setdefault(worker_id, set())
        recorded = self._recorded.get(worker_id)
        for block_hash in hashes:
            self._touch(block_hash)[worker_id] = CONFIRMED
            confirmed.add(block_hash)
            if recorded is not None:
                recorded.pop(block_hash, None)

    def remove(self, worker_id: str, hashes: Iterable[int]) -> None:
        """The worker's events say it evicted these blocks."""
        for block_hash in hashes:
            self._drop(block_hash, worker_id)

    def record(
        self,
        worker_id: str,
        hashes: Sequence[int],
        *,
        expires_s: float,
        capacity_blocks: int | None = None,
    ) -> None:
        """The router sent these blocks to the worker; trust that until ``expires_s``."""
        recorded = self._recorded.setdefault(worker_id, OrderedDict())
        for block_hash in hashes:
            holders = self._touch(block_hash)
            if holders.get(worker_id) == CONFIRMED:
                continue
            holders[worker_id] = expires_s
            recorded[block_hash] = None
            recorded.move_to_end(block_hash)
        if capacity_blocks is not None:
            while len(recorded) > capacity_blocks:
                self._drop(next(iter(recorded)), worker_id)

    def clear_worker(self, worker_id: str) -> int:
        """Forget everything about a worker (restart, gap, AllBlocksCleared); returns count."""
        held = [*self._confirmed.pop(worker_id, ()), *self._recorded.pop(worker_id, ())]
        for block_hash in held:
            holders = self._holders.get(block_hash)
            if holders is not None:
                holders.pop(worker_id, None)
                if not holders:
                    del self._holders[block_hash]
        return len(held)

    def expire(self, now_s: float) -> int:
        """Drop expired recorded entries. Each worker records in time order with one TTL
        at a time, so its oldest entries expire first: stop at the first live one."""
        dropped = 0
        for worker_id, recorded in list(self._recorded.items()):
            while recorded:
                oldest = next(iter(recorded))
                if self._holders.get(oldest, {}).get(worker_id, 0.0) > now_s:
                    break
                self._drop(oldest, worker_id)
                dropped += 1
        return dropped

    def _touch(self, block_hash: int) -> dict[str, float]:
        holders = self._holders.get(block_hash)
        if holders is None:
            holders = self._holders[block_hash] = {}
            if len(self._holders) > self._max_blocks:
                self._evict_least_recent()
        else:
            self._holders.move_to_end(block_hash)
        return holders

    def _evict_least_recent(self) -> None:
        block_hash, holders = self._holders.popitem(last=False)
        for worker_id in holders:
            self._confirmed.get(worker_id, set()).discard(block_hash)
            self._recorded.get(worker_id, {}).pop(block_hash, None)

    def _drop(self, block_hash: int, worker_id: str) -> None:
        holders = self._holders.get(block_hash)
        if holders is not None and holders.pop(worker_id, None) is not None and not holders:
            del self._holders[block_hash]
        self._confirmed.get(worker_id, set()).discard(block_hash)
        recorded = self._recorded.get(worker_id)
        if recorded is not None:
            recorded.pop(block_hash, None)
