"""KV events on the wire, exactly as vLLM's ``ZmqEventPublisher`` sends them.

Each ZMQ message is three frames: topic, an 8-byte big-endian sequence number, and
a msgpack ``KVEventBatch``: ``[ts, [event, ...]]``, where each event is a map
tagged ``{"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared", ...}`` and
block hashes are the 64-bit integers of ``external_block_hash``.

Endpoint binding follows vLLM: ``tcp://*:PORT`` binds (subscribers connect);
an endpoint naming a host connects (the subscriber binds). Sends never block: a
subscriber that cannot keep up loses events (ZMQ's high-water mark), as with vLLM.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import msgpack
import zmq

from contracts.block_hashing import external_block_hash
from sim.kv_cache import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

MEDIUM = "GPU"


def event_to_wire(event: KVEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return {
            "type": "BlockStored",
            "block_hashes": [external_block_hash(h) for h in event.block_hashes],
            "parent_block_hash": None if parent is None else external_block_hash(parent),
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": MEDIUM,
            "lora_name": None,
        }
    if isinstance(event, BlockRemoved):
        hashes = [external_block_hash(h) for h in event.block_hashes]
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM}
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(events: list[KVEvent], ts: float) -> bytes:
    return msgpack.packb([ts, [event_to_wire(e) for e in events]], use_bin_type=True)


def binds(endpoint: str) -> bool:
    return "*" in endpoint or "0.0.0.0" in endpoint


class KVEventPublisher:
    def __init__(self, endpoint: str, *, topic: str = "", high_water_mark: int = 100_000) -> None:
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.set_hwm(high_water_mark)
        self._socket.setsockopt(zmq.LINGER, 0)
        if binds(endpoint):
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)
        self._topic = topic.encode()
        self._sequence = itertools.count()
        self.dropped = 0  # batches lost to a slow subscriber

    def __repr__(self) -> str:
        return f"KVEventPublisher(topic={self._topic!r})"

    def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        sequence = next(self._sequence).to_bytes(8, "big")
        payload = encode_batch(events, time.time())
        try:
            self._socket.send_multipart((self._topic, sequence, payload), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._socket.close(linger=0)
