"""The sim's KV event publisher: the pool's events in vLLM's wire format (contracts.kv_events).

Endpoint binding follows vLLM (``tcp://*:PORT`` binds, a named host connects).
Sends never block: a subscriber that cannot keep up loses events (ZMQ's
high-water mark), as with vLLM.
"""

from __future__ import annotations

import itertools
import time

import zmq

from contracts import kv_events as wire
from contracts.block_hashing import external_block_hash
from sim.kv_cache import PoolBlocksEvicted, PoolBlocksStored, PoolCleared, PoolEvent


def to_wire(event: PoolEvent) -> wire.WireEvent:
    """The pool's event with its hashes in the external (64-bit) form vLLM publishes."""
    if isinstance(event, PoolBlocksStored):
        parent = event.parent_block_hash
        return wire.BlocksStored(
            block_hashes=tuple(external_block_hash(h) for h in event.block_hashes),
            parent_block_hash=None if parent is None else external_block_hash(parent),
            token_ids=event.token_ids,
            block_size=event.block_size,
        )
    if isinstance(event, PoolBlocksEvicted):
        return wire.BlocksRemoved(tuple(external_block_hash(h) for h in event.block_hashes))
    if isinstance(event, PoolCleared):
        return wire.AllBlocksCleared()
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(events: list[PoolEvent], ts: float) -> bytes:
    return wire.encode_batch([to_wire(e) for e in events], ts)


class KVEventPublisher:
    def __init__(
        self,
        endpoint: str,
        *,
        bind: bool = False,
        topic: str = "",
        high_water_mark: int = 100_000,
    ) -> None:
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.set_hwm(high_water_mark)
        self._socket.setsockopt(zmq.LINGER, 0)
        if bind or wire.binds(endpoint):
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)
        self._topic = topic.encode()
        self._sequence = itertools.count()
        self.dropped = 0  # batches lost to a slow subscriber

    def __repr__(self) -> str:
        return f"KVEventPublisher(topic={self._topic!r})"

    def publish(self, events: list[PoolEvent], *, lost: bool = False) -> None:
        """Send one batch; ``lost`` (fault injection) spends its sequence number and
        sends nothing, as a batch lost on the way would, so subscribers see the gap."""
        if not events:
            return
        sequence = next(self._sequence).to_bytes(8, "big")
        if lost:
            return
        payload = encode_batch(events, time.time())
        try:
            self._socket.send_multipart((self._topic, sequence, payload), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._socket.close(linger=0)
