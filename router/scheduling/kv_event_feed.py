"""Subscribes to every worker's KV events and keeps the prefix index in step with them.

One ZMQ SUB socket and one task per worker that publishes events. ZMQ reconnects
by itself after an engine restart; what it cannot tell us is what we missed, so:
- a sequence number that jumps ahead is a *gap* (events were lost): the worker's
  entries are dropped and it counts as not live for ``fallback_s``;
- a sequence number that goes back is a *restart* (a new engine counts from 0):
  the worker's entries are dropped;
- a new incarnation at registration drops them too (``watch``).
A worker is *live* once a batch has arrived since then and no gap is recent; the
router trusts its own routing-time records for longer while a worker is not live
(the approximate index).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from contracts.kv_events import (
    AllBlocksCleared,
    BlocksRemoved,
    BlocksStored,
    MalformedEvents,
    decode_batch,
    sequence_number,
)
from router.fleet.background import keep_running
from router.scheduling.prefix_index import PrefixIndex

log = logging.getLogger("pdserve.router")


@dataclass(slots=True)
class FeedState:
    endpoint: str
    incarnation: int
    task: asyncio.Task | None = None
    last_sequence: int | None = None
    batches: int = 0
    gaps: int = 0
    not_live_until_s: float = 0.0


class KVEventFeed:
    def __init__(
        self,
        index: PrefixIndex,
        *,
        fallback_s: float,
        clock: Callable[[], float],
        on_event: Callable[[str, str], None] = lambda worker_id, kind: None,
    ) -> None:
        self._index = index
        self._fallback_s = fallback_s
        self._clock = clock
        self._on_event = on_event  # (worker id, "batch" | "gap" | "restart" | "malformed")
        self._context = zmq.asyncio.Context()
        self._feeds: dict[str, FeedState] = {}

    def __repr__(self) -> str:
        return f"KVEventFeed(workers={len(self._feeds)})"

    def watch(self, worker_id: str, endpoint: str, incarnation: int) -> None:
        """Follow a worker's events; a new endpoint or incarnation starts from nothing."""
        feed = self._feeds.get(worker_id)
        if feed is not None and (feed.endpoint, feed.incarnation) == (endpoint, incarnation):
            return
        self.unwatch(worker_id)
        feed = self._feeds[worker_id] = FeedState(endpoint=endpoint, incarnation=incarnation)
        feed.task = asyncio.get_running_loop().create_task(
            keep_running(f"kv_events:{worker_id}", lambda: self._follow(worker_id, feed),
                         on_crash=lambda _: self._crashed(worker_id, feed))
        )  # fmt: skip

    def unwatch(self, worker_id: str) -> None:
        feed = self._feeds.pop(worker_id, None)
        if feed is not None and feed.task is not None:
            feed.task.cancel()
        self._index.clear_worker(worker_id)

    def is_live(self, worker_id: str) -> bool:
        feed = self._feeds.get(worker_id)
        return feed is not None and feed.batches > 0 and self._clock() >= feed.not_live_until_s

    async def close(self) -> None:
        tasks = [f.task for f in self._feeds.values() if f.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._feeds.clear()
        self._context.term()

    async def _follow(self, worker_id: str, feed: FeedState) -> None:
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(feed.endpoint)
        try:
            while True:
                frames = await socket.recv_multipart()
                self._apply(worker_id, feed, frames)
        finally:
            socket.close(linger=0)

    def _crashed(self, worker_id: str, feed: FeedState) -> None:
        """What the crash may have lost is unknown: start the worker's index over, and
        let the approximate index stand in while events flow again."""
        self._index.clear_worker(worker_id)
        feed.last_sequence = None
        feed.not_live_until_s = self._clock() + self._fallback_s
        self._on_event(worker_id, "crash")

    def _apply(self, worker_id: str, feed: FeedState, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self._on_event(worker_id, "malformed")
            return
        _, sequence_frame, payload = frames
        sequence = sequence_number(sequence_frame)
        if feed.last_sequence is not None and sequence != feed.last_sequence + 1:
            kind = "restart" if sequence <= feed.last_sequence else "gap"
            self._index.clear_worker(worker_id)
            if kind == "gap":
                feed.gaps += 1
                feed.not_live_until_s = self._clock() + self._fallback_s
            log.info("KV events from %s: %s at sequence %d", worker_id, kind, sequence)
            self._on_event(worker_id, kind)
        feed.last_sequence = sequence
        try:
            batch = decode_batch(payload)
        except MalformedEvents:
            self._on_event(worker_id, "malformed")
            return
        feed.batches += 1
        self._on_event(worker_id, "batch")
        for event in batch.events:
            if isinstance(event, BlocksStored):
                self._index.confirm(worker_id, event.block_hashes)
            elif isinstance(event, BlocksRemoved):
                self._index.remove(worker_id, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self._index.clear_worker(worker_id)
