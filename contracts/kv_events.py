"""KV cache events on the wire, exactly as vLLM's ``ZmqEventPublisher`` sends them.

Each ZMQ message has three frames: topic, an 8-byte big-endian sequence number, and
a msgpack ``EventBatch``: ``[ts, [event, ...], data_parallel_rank?]``. Each event is
a map tagged ``{"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared", ...}``,
and block hashes are the 64-bit integers of ``external_block_hash``. Fields this
module does not model (medium, lora, group ids, ...) are ignored when decoding, so
newer vLLM versions still decode.

Endpoint binding follows vLLM: ``tcp://*:PORT`` binds (subscribers connect); an
endpoint naming a host connects (the subscriber binds).

The simulator publishes with ``encode_batch``; the router subscribes with
``decode_batch``; the real tier checks both against vLLM's own msgspec types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

MEDIUM = "GPU"


@dataclass(frozen=True, slots=True)
class BlocksStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


WireEvent = BlocksStored | BlocksRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[WireEvent, ...]


class MalformedEvents(ValueError):
    """A message that is not a vLLM KV event batch."""


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard host binds; a named host connects."""
    return "*" in endpoint or "0.0.0.0" in endpoint


def _to_wire(event: WireEvent) -> dict[str, Any]:
    if isinstance(event, BlocksStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": MEDIUM,
            "lora_name": None,
        }
    if isinstance(event, BlocksRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": MEDIUM}
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(events: list[WireEvent], ts: float) -> bytes:
    return msgpack.packb([ts, [_to_wire(e) for e in events]], use_bin_type=True)


def _hash(value: Any) -> int:
    # vLLM may publish a raw bytes hash when it is not converted to the external form.
    if isinstance(value, bytes):
        return int.from_bytes(value, "big") & ((1 << 64) - 1)
    if isinstance(value, int):
        return value
    raise MalformedEvents(f"block hash of type {type(value).__name__}")


def _from_wire(raw: Any) -> WireEvent | None:
    if not isinstance(raw, dict):
        raise MalformedEvents("event is not a map")
    kind = raw.get("type")
    if kind == "BlockStored":
        parent = raw.get("parent_block_hash")
        return BlocksStored(
            block_hashes=tuple(_hash(h) for h in raw["block_hashes"]),
            parent_block_hash=None if parent is None else _hash(parent),
            token_ids=tuple(raw.get("token_ids") or ()),
            block_size=int(raw["block_size"]),
        )
    if kind == "BlockRemoved":
        return BlocksRemoved(tuple(_hash(h) for h in raw["block_hashes"]))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None  # an event kind this version does not know: skip it


def decode_batch(payload: bytes) -> EventBatch:
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        ts, raw_events = float(raw[0]), raw[1]
        events = tuple(e for e in map(_from_wire, raw_events) if e is not None)
    except (ValueError, KeyError, IndexError, TypeError, msgpack.UnpackException) as error:
        raise MalformedEvents(f"not a KV event batch: {error}") from None
    return EventBatch(ts=ts, events=events)


def sequence_number(frame: bytes) -> int:
    return int.from_bytes(frame, "big")
