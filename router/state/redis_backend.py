"""The Redis backend: several router replicas share one view, announced by pub/sub.

Keys under ``prefix`` (default ``pdserve``):
- ``worker:<id>``: the record as JSON, with a TTL the next put renews; ``workers``: the
  set of ids (pruned of expired ones when read);
- ``targets``: hash model -> ``{"prefill": N, "decode": M}``;
- ``doc`` and ``docver``: hashes name -> document JSON, and name -> version, written in
  one MULTI so a version always matches its document;
- ``audit``: a list, RPUSH then LTRIM in one MULTI (capped);
- ``review``: a hash id -> flagged item, ``reviewq`` the ids oldest first (capped by one
  Lua script that drops the oldest), ``reviewtext:<id>`` a kept prompt, with its TTL;
- channel ``changes``: ``kind:key`` for every write;
- ``bucket:<name>``: a token bucket (tokens, at), taken from by one Lua script on the
  server's clock (replicas' clocks never meet), expiring once it would be full again.
A Redis that cannot be reached raises ``StateUnavailable``; the subscriber reconnects
with capped backoff and announces a ``resync``, since it may have missed writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from router.admission.token_bucket import BucketRate
from router.state.base import (
    DEFAULT_LIMITS,
    AuditEntry,
    Change,
    ControlState,
    PoolTargets,
    StateConflict,
    StateFull,
    StateLimits,
    StateUnavailable,
    check_batch_line,
)

_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_RECONNECT_MAX_S = 2.0

# token_bucket.take, run atomically on the server's clock. Returns the wait as a string:
# a Lua number would come back truncated to an integer.
_TAKE_TOKENS = """
local capacity, refill, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local stored = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = capacity
if stored[1] then
  local elapsed = math.max(0, now - tonumber(stored[2]))
  tokens = math.min(capacity, tonumber(stored[1]) + elapsed * refill)
end
cost = math.min(cost, capacity)
local wait = 0
if tokens >= cost then tokens = tokens - cost else wait = (cost - tokens) / refill end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / refill * 1000) + 1000)
return tostring(wait)
"""

# put_document with expected_version: compare and set in one step. Returns the new
# version, or -1 - the current one on a conflict.
_PUT_IF = """
local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if ARGV[3] ~= '' and current ~= tonumber(ARGV[3]) then return -1 - current end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
"""

# add_review: queue the item, then drop the oldest past the cap (and their texts).
_ADD_REVIEW = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1])
while redis.call('LLEN', KEYS[2]) > tonumber(ARGV[3]) do
  local dropped = redis.call('LPOP', KEYS[2])
  redis.call('HDEL', KEYS[1], dropped)
  redis.call('DEL', ARGV[4] .. dropped)
end
return 1
"""


class RedisState(ControlState):
    def __init__(
        self,
        url: str,
        limits: StateLimits = DEFAULT_LIMITS,
        *,
        prefix: str = "pdserve",
        timeout_s: float = 1.0,
    ) -> None:
        self.limits = limits
        self._url = url
        self._prefix = prefix
        self._redis = aioredis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            decode_responses=True,
        )  # fmt: skip
        self._closed = asyncio.Event()
        self._take_script = self._redis.register_script(_TAKE_TOKENS)
        self._put_if_script = self._redis.register_script(_PUT_IF)
        self._add_review_script = self._redis.register_script(_ADD_REVIEW)

    def __repr__(self) -> str:
        return f"RedisState({self._url!r}, prefix={self._prefix!r})"

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    async def _call(self, operation: Any) -> Any:
        try:
            return await operation
        except _UNREACHABLE as error:
            raise StateUnavailable(f"redis at {self._url} unreachable: {error}") from error

    async def _announce(self, change: Change) -> None:
        await self._call(self._redis.publish(self._key("changes"), f"{change.kind}:{change.key}"))

    async def put_worker(self, worker_id: str, record: dict[str, Any], *, ttl_s: float) -> None:
        payload = _sized(record, self.limits)
        known = await self._call(self._redis.sismember(self._key("workers"), worker_id))
        if not known and len(await self.workers()) >= self.limits.max_workers:
            raise StateFull(f"{self.limits.max_workers} workers registered (max_workers)")
        async with self._redis.pipeline(transaction=True) as multi:
            multi.set(self._key("worker", worker_id), payload, px=max(1, int(ttl_s * 1000)))
            multi.sadd(self._key("workers"), worker_id)
            await self._call(multi.execute())
        await self._announce(Change("worker", worker_id))

    async def remove_worker(self, worker_id: str) -> bool:
        async with self._redis.pipeline(transaction=True) as multi:
            multi.delete(self._key("worker", worker_id))
            multi.srem(self._key("workers"), worker_id)
            deleted, _ = await self._call(multi.execute())
        if deleted:
            await self._announce(Change("worker", worker_id))
        return bool(deleted)

    async def worker(self, worker_id: str) -> dict[str, Any] | None:
        payload = await self._call(self._redis.get(self._key("worker", worker_id)))
        return None if payload is None else json.loads(payload)

    async def workers(self) -> dict[str, dict[str, Any]]:
        ids = sorted(await self._call(self._redis.smembers(self._key("workers"))))
        if not ids:
            return {}
        payloads = await self._call(self._redis.mget([self._key("worker", w) for w in ids]))
        expired = [w for w, payload in zip(ids, payloads, strict=True) if payload is None]
        if expired:
            await self._call(self._redis.srem(self._key("workers"), *expired))
        return {
            w: json.loads(payload)
            for w, payload in zip(ids, payloads, strict=True)
            if payload is not None
        }

    async def set_targets(self, model: str, targets: PoolTargets) -> None:
        await self._call(
            self._redis.hset(self._key("targets"), model, json.dumps(targets.as_dict()))
        )
        await self._announce(Change("targets", model))

    async def targets(self) -> dict[str, PoolTargets]:
        stored = await self._call(self._redis.hgetall(self._key("targets")))
        return {model: PoolTargets(**json.loads(value)) for model, value in stored.items()}

    async def put_document(
        self, name: str, value: dict[str, Any], *, expected_version: int | None = None
    ) -> int:
        payload = _sized(value, self.limits)
        expected = "" if expected_version is None else str(expected_version)
        version = int(await self._call(self._put_if_script(
            keys=[self._key("docver"), self._key("doc")], args=[name, payload, expected],
        )))  # fmt: skip
        if version < 0:
            raise StateConflict(f"{name} is at version {-1 - version}, not {expected_version}")
        await self._announce(Change("config", name))
        return version

    async def document(self, name: str) -> tuple[int, dict[str, Any]] | None:
        async with self._redis.pipeline(transaction=True) as multi:
            multi.hget(self._key("docver"), name)
            multi.hget(self._key("doc"), name)
            version, payload = await self._call(multi.execute())
        if version is None or payload is None:
            return None
        return int(version), json.loads(payload)

    async def delete_document(self, name: str) -> bool:
        async with self._redis.pipeline(transaction=True) as multi:
            multi.hdel(self._key("doc"), name)
            multi.hdel(self._key("docver"), name)
            deleted, _ = await self._call(multi.execute())
        return bool(deleted)

    async def append_audit(self, entry: AuditEntry) -> None:
        payload = json.dumps(
            {"at_unix_s": entry.at_unix_s, "actor": entry.actor, "action": entry.action,
             "target": entry.target, "outcome": entry.outcome, "detail": entry.detail}
        )  # fmt: skip
        async with self._redis.pipeline(transaction=True) as multi:
            multi.rpush(self._key("audit"), payload)
            multi.ltrim(self._key("audit"), -self.limits.max_audit_entries, -1)
            await self._call(multi.execute())

    async def audit(self, *, limit: int = 100) -> list[AuditEntry]:
        if limit <= 0:
            return []
        stored = await self._call(self._redis.lrange(self._key("audit"), -limit, -1))
        return [AuditEntry(**json.loads(item)) for item in stored]

    async def add_review(
        self, item: dict[str, Any], *, text: str | None, text_ttl_s: float
    ) -> None:
        await self._call(self._add_review_script(
            keys=[self._key("review"), self._key("reviewq")],
            args=[item["id"], json.dumps(item), self.limits.max_review_items,
                  self._key("reviewtext", "")],
        ))  # fmt: skip
        if text is not None:
            ttl_ms = max(1, int(text_ttl_s * 1000))
            await self._call(self._redis.set(self._key("reviewtext", item["id"]), text, px=ttl_ms))

    async def review_items(self, *, limit: int) -> list[dict[str, Any]]:
        if limit <= 0:
            return []
        ids = await self._call(self._redis.lrange(self._key("reviewq"), -limit, -1))
        if not ids:
            return []
        items = await self._call(self._redis.hmget(self._key("review"), ids))
        texts = await self._call(self._redis.mget([self._key("reviewtext", i) for i in ids]))
        found = []
        for payload, text in zip(items, texts, strict=True):
            if payload is not None:
                item = json.loads(payload)
                found.append(item if text is None else {**item, "text": text})
        return found

    async def update_review(self, item_id: str, changes: dict[str, Any]) -> dict[str, Any] | None:
        # A lost race between two reviewers marking one item keeps the last mark: fine.
        payload = await self._call(self._redis.hget(self._key("review"), item_id))
        if payload is None:
            return None
        item = {**json.loads(payload), **changes}
        await self._call(self._redis.hset(self._key("review"), item_id, json.dumps(item)))
        return item

    async def take_tokens(self, bucket: str, cost: float, rate: BucketRate) -> float:
        wait = await self._call(self._take_script(
            keys=[self._key("bucket", bucket)],
            args=[repr(rate.capacity), repr(rate.refill_per_s), repr(float(cost))],
        ))  # fmt: skip
        return float(wait)

    async def record_batch_line(self, batch_id: str, custom_id: str, outcome: str) -> bool:
        check_batch_line(outcome, self.limits)
        kept = await self._call(
            self._redis.hsetnx(self._key("batchlines", batch_id), custom_id, outcome)
        )
        return bool(kept)

    async def batch_lines(self, batch_id: str) -> dict[str, str]:
        found = await self._call(self._redis.hgetall(self._key("batchlines", batch_id)))
        return dict(found)  # decode_responses: str keys and values

    async def drop_batch_lines(self, batch_id: str) -> None:
        await self._call(self._redis.delete(self._key("batchlines", batch_id)))

    async def subscribe(self) -> AsyncIterator[Change]:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._call(pubsub.subscribe(self._key("changes")))
        return self._follow(pubsub)

    async def _follow(self, pubsub: PubSub) -> AsyncIterator[Change]:
        backoff_s = 0.05
        try:
            while not self._closed.is_set():
                with contextlib.suppress(*_UNREACHABLE):
                    async for message in pubsub.listen():
                        kind, _, key = str(message["data"]).partition(":")
                        yield Change(kind, key)  # type: ignore[arg-type]
                        backoff_s = 0.05
                # listen() failed or ended (it ends, at once and forever, once the
                # connection is gone): wait, subscribe again, and re-read everything.
                await pubsub.aclose()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, _RECONNECT_MAX_S)
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                try:
                    await pubsub.subscribe(self._key("changes"))
                except _UNREACHABLE:
                    continue
                yield Change("resync")  # writes may have passed while we were away
        finally:
            await pubsub.aclose()

    async def close(self) -> None:
        self._closed.set()
        await self._redis.aclose()


def _sized(value: dict[str, Any], limits: StateLimits) -> str:
    payload = json.dumps(value)
    if len(payload) > limits.max_document_bytes:
        raise StateFull(
            f"{len(payload)} bytes is over max_document_bytes={limits.max_document_bytes}"
        )
    return payload
