"""Token buckets, as pure arithmetic: the same rule in memory and in Redis (Lua).

A bucket holds up to ``capacity`` tokens and refills at ``refill_per_s``. Taking
``cost`` succeeds when the bucket holds that much; otherwise nothing is taken and the
answer is how long until it would hold it (the client's Retry-After). A cost over the
capacity is taken as the whole capacity, so one request bigger than a minute's quota
waits for a full bucket instead of never being served.

Invariants: ``0 <= level <= capacity``; a bucket unseen for ``capacity / refill_per_s``
is full, so forgetting it changes nothing (what lets stores cap and expire them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BucketRate:
    """A rate as tokens per minute, the unit tenants are configured in."""

    per_minute: float

    @property
    def capacity(self) -> float:
        return self.per_minute  # a minute's worth: the burst a tenant may send at once

    @property
    def refill_per_s(self) -> float:
        return self.per_minute / 60.0

    @property
    def full_after_s(self) -> float:
        return self.capacity / self.refill_per_s


@dataclass(frozen=True, slots=True)
class BucketLevel:
    tokens: float
    at_s: float


def take(
    level: BucketLevel | None, cost: float, rate: BucketRate, now_s: float
) -> tuple[BucketLevel, float]:
    """(the bucket after, seconds to wait: 0 when taken)."""
    capacity = rate.capacity
    if level is None:
        tokens = capacity
    else:
        elapsed_s = max(0.0, now_s - level.at_s)  # a clock step back refills nothing
        tokens = min(capacity, level.tokens + elapsed_s * rate.refill_per_s)
    cost = min(cost, capacity)
    if tokens >= cost:
        return BucketLevel(tokens - cost, now_s), 0.0
    return BucketLevel(tokens, now_s), (cost - tokens) / rate.refill_per_s
