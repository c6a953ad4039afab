"""Typed ``kv_transfer_params``: what prefill hands to decode through the router.

vLLM's NixlConnector returns a handoff from a ``do_remote_decode`` request; the
router forwards it to a decode engine, which pulls the named blocks over NIXL.

Invariants enforced here:
- a handoff the router forwards always names an engine, a reachable host/port and
  at least one block; anything else is refused with ``InvalidHandoff``;
- a handoff older than its lease is refused with ``ExpiredHandoff``: by then the
  producer may have freed the blocks, and decode would read garbage or stall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The request-side marker that asks a producer to keep the KV for a remote decode.
PREFILL_REQUEST_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class InvalidHandoff(ValueError):
    """The producer returned kv_transfer_params that cannot be forwarded."""


class ExpiredHandoff(ValueError):
    """The handoff outlived its lease; re-run prefill."""


@dataclass(frozen=True, slots=True)
class KVHandoff:
    """A validated handoff. ``raw`` keeps vLLM's fields we do not model, verbatim."""

    remote_engine_id: str
    remote_host: str
    remote_port: int
    remote_block_ids: tuple
    remote_request_id: str | None
    issued_at_s: float
    raw: dict[str, Any]

    def to_decode_params(self) -> dict[str, Any]:
        """The ``kv_transfer_params`` to send to the decode engine."""
        return dict(self.raw)

    def lease_holds(self, now_s: float, lease_s: float) -> bool:
        return now_s - self.issued_at_s <= lease_s

    def check_lease(self, now_s: float, lease_s: float) -> None:
        age_s = now_s - self.issued_at_s
        if not self.lease_holds(now_s, lease_s):
            raise ExpiredHandoff(
                f"KV handoff from engine {self.remote_engine_id} is {age_s:.1f}s old, "
                f"past its {lease_s:.1f}s lease; the prefill must be redone"
            )


def _count_blocks(block_ids: Any) -> int:
    """Block ids are a flat list, or one list per KV-cache group in hybrid models."""
    if not isinstance(block_ids, list):
        raise InvalidHandoff("remote_block_ids must be a list")
    total = 0
    for item in block_ids:
        if isinstance(item, list):
            total += _count_blocks(item)
        elif isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            total += 1
        else:
            raise InvalidHandoff(f"remote_block_ids holds a non-block value: {item!r}")
    return total


def _freeze(block_ids: list) -> tuple:
    return tuple(_freeze(b) if isinstance(b, list) else b for b in block_ids)


def parse_handoff(raw: Any, *, issued_at_s: float) -> KVHandoff:
    """Validate a producer's ``kv_transfer_params``; raise ``InvalidHandoff`` if unusable."""
    if not isinstance(raw, dict):
        raise InvalidHandoff("prefill response has no kv_transfer_params object")
    if raw.get("do_remote_prefill") is not True:
        raise InvalidHandoff("kv_transfer_params.do_remote_prefill must be true in a handoff")
    engine_id = raw.get("remote_engine_id")
    if not isinstance(engine_id, str) or not engine_id:
        raise InvalidHandoff("kv_transfer_params.remote_engine_id is missing")
    host = raw.get("remote_host")
    if not isinstance(host, str) or not host:
        raise InvalidHandoff("kv_transfer_params.remote_host is missing")
    port = raw.get("remote_port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise InvalidHandoff(f"kv_transfer_params.remote_port is not a port: {port!r}")
    block_ids = raw.get("remote_block_ids")
    if _count_blocks(block_ids) == 0:
        raise InvalidHandoff("kv_transfer_params.remote_block_ids is empty")
    request_id = raw.get("remote_request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidHandoff("kv_transfer_params.remote_request_id must be a string")
    return KVHandoff(
        remote_engine_id=engine_id,
        remote_host=host,
        remote_port=port,
        remote_block_ids=_freeze(block_ids),
        remote_request_id=request_id,
        issued_at_s=issued_at_s,
        raw=dict(raw),
    )
