"""One model's prefill queue, bounded in uncached prompt tokens, with priority and fairness.

Invariants:
- ``admitted_tokens`` (granted, not yet released) stays within ``limit_tokens``, except
  that one request is always admitted into an empty queue, however large (else a prompt
  over the limit could never run);
- requests with a limit of their own (batch lines: ``batch_prefill_share``) are granted
  only while the tokens admitted under such limits (``limited_tokens``) stay within it,
  one always allowed when none is admitted: however much batch work waits, it holds at
  most that much of the engines' queue;
- a waiting request leaves by one of three doors: granted, its deadline passed
  (``QueueDeadline``), or its caller cancelled; none leaves a grant or a slot behind;
- classes are strict (a waiting ``interactive`` request goes before any ``standard``);
  within a class, tenants share by weight: the next grant goes to the tenant with the
  least ``served tokens / weight`` (a virtual time), and a tenant that arrives starts at
  the lowest virtual time present, so idling earns no credit to burst with later;
- at most ``max_waiting`` requests wait; the next one is refused (``QueueFull``);
- ``sheltered``: a tenant within its weighted share of ``limit_tokens`` while another is
  over its own is not the one to refuse when the pool is full: admission queues it
  (where it goes first) instead of refusing it for a queue that others made.

Grants are released by the caller once the request's prefill is done (or it failed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class QueueFull(Exception):
    """``max_waiting`` requests are already waiting."""


class QueueDeadline(Exception):
    """The request's deadline passed while it waited."""


@dataclass(slots=True, eq=False)
class _Waiter:
    tenant: str
    weight: float
    cost: int
    arrival: int  # breaks virtual-time ties: the older head goes first
    future: asyncio.Future[None] = field(repr=False)
    own_limit_tokens: int | None = None

    @property
    def limited(self) -> bool:
        return self.own_limit_tokens is not None


class Grant:
    """Admitted prefill tokens; ``release`` once the prefill is done (idempotent)."""

    __slots__ = ("_queue", "cost", "limited", "tenant")

    def __init__(
        self, queue: PrefillQueue | None, cost: int, tenant: str = "", limited: bool = False
    ) -> None:
        self._queue = queue
        self.cost = cost
        self.tenant = tenant
        self.limited = limited  # granted under a limit of its own (a batch line)

    def release(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue._released(self.cost, self.tenant, self.limited)


class PrefillQueue:
    def __init__(self, *, max_waiting: int, clock: Callable[[], float]) -> None:
        self._max_waiting = max_waiting
        self._clock = clock
        self.admitted_tokens = 0
        self.limited_tokens = 0  # of those, granted under a limit of their own
        self.limit_tokens = 0
        self._classes: dict[int, dict[str, deque[_Waiter]]] = {}
        self._virtual: dict[tuple[int, str], float] = {}
        self._waiting = 0
        self._arrivals = 0
        self.waiting_tokens = 0
        self._admitted_by: dict[str, list[float]] = {}  # tenant -> [tokens, weight]

    def __repr__(self) -> str:
        return (
            f"PrefillQueue(admitted={self.admitted_tokens}/{self.limit_tokens}, "
            f"waiting={self._waiting})"
        )

    @property
    def waiting(self) -> int:
        return self._waiting

    def waiting_above(self, priority: int) -> bool:
        """Whether a request of a higher class than ``priority`` waits."""
        return any(cls < priority for cls in self._classes)

    def tokens_ahead(self, *, priority: int, tenant: str, weight: float, cost: int) -> int:
        """Waiting tokens granted before a new request of this tenant, class and cost:
        every higher class, and within its own class each tenant's share up to the point
        where this one is served (weighted fair queueing), not the whole queue."""
        ahead = 0
        for cls, tenants in self._classes.items():
            if cls < priority:
                ahead += sum(w.cost for queue in tenants.values() for w in queue)
            elif cls == priority:
                own = sum(w.cost for w in tenants.get(tenant, ())) + cost
                for other, queue in tenants.items():
                    if other != tenant and queue:
                        share = own * queue[0].weight / weight
                        ahead += min(sum(w.cost for w in queue), int(share))
                ahead += own - cost
        return ahead

    async def enter(
        self, *, tenant: str, priority: int, weight: float, cost: int, limit_tokens: int,
        deadline_s: float, own_limit_tokens: int | None = None,
    ) -> Grant:  # fmt: skip
        """Wait for a grant of ``cost`` tokens; ``own_limit_tokens``: granted only while
        the tokens admitted under such limits stay within this too."""
        self.limit_tokens = limit_tokens
        limited = own_limit_tokens is not None
        if self._waiting == 0 and self._fits(cost, own_limit_tokens):
            self._admit(tenant, weight, cost, limited)
            return Grant(self, cost, tenant, limited)
        if self._waiting >= self._max_waiting:
            raise QueueFull(f"{self._waiting} requests already wait (max_queued_requests)")
        self._arrivals += 1
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(tenant, weight, cost, self._arrivals, future, own_limit_tokens)
        self._join(priority, waiter)
        self._dispatch()
        try:
            await asyncio.wait({waiter.future}, timeout=max(0.0, deadline_s - self._clock()))
        except asyncio.CancelledError:
            self._leave(priority, waiter)
            raise
        if waiter.future.done():
            return Grant(self, cost, tenant, limited)
        self._leave(priority, waiter)
        raise QueueDeadline("the request's TTFT deadline passed while it waited")

    def sheltered(self, tenant: str, weight: float, cost: int, limit_tokens: int) -> bool:
        """Is this tenant, with this request, within its weighted share of the limit while
        another tenant is over its own? Shares split the limit among the tenants with
        work admitted or waiting (this one included), by weight."""
        weights = {t: w for t, (_, w) in self._admitted_by.items()}
        for tenants in self._classes.values():
            weights.update((t, queue[0].weight) for t, queue in tenants.items() if queue)
        weights[tenant] = weight
        per_weight = limit_tokens / sum(weights.values())
        mine = self._admitted_by.get(tenant, (0.0,))[0] + cost
        if mine > per_weight * weight:
            return False
        return any(tokens > per_weight * w for t, (tokens, w) in self._admitted_by.items()
                   if t != tenant)  # fmt: skip

    def _admit(self, tenant: str, weight: float, cost: int, limited: bool) -> None:
        self.admitted_tokens += cost
        self.limited_tokens += cost if limited else 0
        held = self._admitted_by.setdefault(tenant, [0.0, weight])
        held[0] += cost
        held[1] = weight

    def _fits(self, cost: int, own_limit_tokens: int | None = None) -> bool:
        if self.admitted_tokens == 0:
            return True
        if self.admitted_tokens + cost > self.limit_tokens:
            return False
        return (
            own_limit_tokens is None
            or self.limited_tokens == 0
            or self.limited_tokens + cost <= own_limit_tokens
        )

    def _join(self, priority: int, waiter: _Waiter) -> None:
        tenants = self._classes.setdefault(priority, {})
        if waiter.tenant not in tenants:
            present = [self._virtual[(priority, t)] for t in tenants]
            self._virtual[(priority, waiter.tenant)] = min(present, default=0.0)
            tenants[waiter.tenant] = deque()
        tenants[waiter.tenant].append(waiter)
        self._waiting += 1
        self.waiting_tokens += waiter.cost

    def _leave(self, priority: int, waiter: _Waiter) -> None:
        """Take a waiter out (deadline or cancel); a grant made meanwhile is given back."""
        if waiter.future.done():
            if not waiter.future.cancelled():
                self._released(waiter.cost, waiter.tenant, waiter.limited)
            return
        waiter.future.cancel()
        queue = self._classes.get(priority, {}).get(waiter.tenant)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
                self._waiting -= 1
                self.waiting_tokens -= waiter.cost
            self._drop_if_empty(priority, waiter.tenant)
        self._dispatch()  # the head may have been what blocked the rest

    def _drop_if_empty(self, priority: int, tenant: str) -> None:
        tenants = self._classes[priority]
        if not tenants[tenant]:
            del tenants[tenant]
            del self._virtual[(priority, tenant)]
            if not tenants:
                del self._classes[priority]

    def _released(self, cost: int, tenant: str, limited: bool) -> None:
        self.admitted_tokens -= cost
        self.limited_tokens -= cost if limited else 0
        held = self._admitted_by.get(tenant)
        if held is not None:
            held[0] -= cost
            if held[0] <= 0:
                del self._admitted_by[tenant]
        self._dispatch()

    def _dispatch(self) -> None:
        while self._classes:
            priority = min(self._classes)
            tenants = self._classes[priority]
            tenant = min(
                tenants, key=lambda t: (self._virtual[(priority, t)], tenants[t][0].arrival)
            )
            head = tenants[tenant][0]
            if not self._fits(head.cost, head.own_limit_tokens):
                return
            tenants[tenant].popleft()
            self._waiting -= 1
            self.waiting_tokens -= head.cost
            self._virtual[(priority, tenant)] += head.cost / head.weight
            self._drop_if_empty(priority, tenant)
            self._admit(head.tenant, head.weight, head.cost, head.limited)
            head.future.set_result(None)
