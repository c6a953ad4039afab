"""Which worker holds which prompt blocks: the prefix index and what keeps it current.

The index is fed two ways (``index`` settings, ``prefix_index_source``):
- precise: each worker's KV events (``KVEventFeed``), watched from registration on;
- approximate: routing-time records, what this router sent where, with a TTL. While a
  worker's events flow they only bridge the gap until its BlockStored arrives (short
  TTL); without events they are all there is (long TTL, capped by its KV capacity).
A worker's new incarnation starts empty; a worker that leaves is forgotten whole.
"""

from __future__ import annotations

from collections.abc import Callable

from contracts.workers import WorkerRegistration
from router.prepare.prompt_blocks import PromptBlocks
from router.scheduling.kv_event_feed import KVEventFeed
from router.scheduling.prefix_index import PrefixIndex
from router.settings import IndexSettings


class PrefixTracker:
    def __init__(
        self,
        settings: IndexSettings,
        *,
        clock: Callable[[], float],
        on_event: Callable[[str, str], None],
    ) -> None:
        self._settings = settings
        self._clock = clock
        self.index = PrefixIndex(max_blocks=settings.prefix_index_max_blocks)
        self._feed = KVEventFeed(
            self.index, fallback_s=settings.kv_events_fallback_s, clock=clock, on_event=on_event
        )
        self._capacity_blocks: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"PrefixTracker(index={self.index!r})"

    @property
    def _events_used(self) -> bool:
        return self._settings.prefix_index_source != "approximate"

    def on_registered(self, registration: WorkerRegistration, new_incarnation: bool) -> None:
        worker_id = registration.worker_id
        if registration.block_size and registration.kv_capacity_tokens:
            self._capacity_blocks[worker_id] = (
                registration.kv_capacity_tokens // registration.block_size
            )
        if new_incarnation:
            self.index.clear_worker(worker_id)
        if registration.kv_events_endpoint and self._events_used:
            self._feed.watch(worker_id, registration.kv_events_endpoint, registration.incarnation)

    def on_gone(self, worker_id: str) -> None:
        self._feed.unwatch(worker_id)
        self.index.clear_worker(worker_id)
        self._capacity_blocks.pop(worker_id, None)

    def match(self, blocks: PromptBlocks) -> dict[str, int]:
        """Worker id -> how many of the prompt's leading blocks it holds."""
        if not blocks.known:
            return {}
        return self.index.match(blocks.leading(), self._clock())

    def record(self, worker_id: str, blocks: PromptBlocks) -> None:
        """The worker is about to compute or receive these blocks."""
        if not blocks.known:
            return
        live = self._events_used and self._feed.is_live(worker_id)
        settings = self._settings
        ttl_s = settings.prefix_speculative_ttl_s if live else settings.prefix_approximate_ttl_s
        self.index.record(
            worker_id, blocks.all(), expires_s=self._clock() + ttl_s,
            capacity_blocks=self._capacity_blocks.get(worker_id),
        )  # fmt: skip

    def expire(self) -> int:
        return self.index.expire(self._clock())

    async def close(self) -> None:
        await self._feed.close()
