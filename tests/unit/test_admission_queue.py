"""The prefill queue: its token bound, priority classes, weighted fairness, deadlines."""

from __future__ import annotations

import asyncio

import pytest

from router.admission.admission_queue import PrefillQueue, QueueDeadline, QueueFull


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


FAR = 1e9  # a deadline that never comes


def enter(queue: PrefillQueue, tenant: str, cost: int, *, priority: int = 1, weight: float = 1.0,
          deadline_s: float = FAR, limit: int = 100):  # fmt: skip
    return queue.enter(tenant=tenant, priority=priority, weight=weight, cost=cost,
                       limit_tokens=limit, deadline_s=deadline_s)  # fmt: skip


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_within_the_bound_is_granted_at_once_and_beyond_it_waits_for_a_release():
    queue = PrefillQueue(max_waiting=10, clock=Clock())
    first = await enter(queue, "a", 60)
    second = await enter(queue, "a", 40)
    third = asyncio.create_task(enter(queue, "a", 1))
    await settle()
    assert not third.done() and queue.waiting == 1 and queue.admitted_tokens == 100
    first.release()
    first.release()  # idempotent
    await settle()
    assert third.done() and queue.admitted_tokens == 41
    second.release()
    (await third).release()
    assert queue.admitted_tokens == 0 and queue.waiting == 0


async def test_one_request_over_the_bound_still_runs_alone():
    queue = PrefillQueue(max_waiting=10, clock=Clock())
    grant = await enter(queue, "a", 5000)
    assert queue.admitted_tokens == 5000
    grant.release()


async def order_of_grants(queue: PrefillQueue, arrivals: list[tuple[str, int, float]]) -> list[str]:
    """Fill the queue, then release one grant at a time; the tenants in grant order."""
    blocker = await enter(queue, "blocker", 100)
    order: list[str] = []

    async def one(tenant: str, priority: int, weight: float) -> None:
        grant = await enter(queue, tenant, 100, priority=priority, weight=weight)
        order.append(tenant)
        await asyncio.sleep(0)
        grant.release()

    tasks = []
    for tenant, priority, weight in arrivals:
        tasks.append(asyncio.create_task(one(tenant, priority, weight)))
        await settle()
    blocker.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    return order


async def test_a_higher_class_goes_first_whenever_it_arrived():
    queue = PrefillQueue(max_waiting=100, clock=Clock())
    order = await order_of_grants(queue, [("batch", 2, 1), ("batch", 2, 1), ("chat", 0, 1)])
    assert order == ["chat", "batch", "batch"]


async def test_a_burst_cannot_starve_a_tenant_that_arrives_after_it():
    queue = PrefillQueue(max_waiting=100, clock=Clock())
    burst = [("noisy", 1, 1.0)] * 10
    order = await order_of_grants(queue, [*burst, ("polite", 1, 1.0), ("polite", 1, 1.0)])
    # Equal weights alternate from the moment "polite" arrives; it does not wait for ten.
    assert order[:4] == ["noisy", "polite", "noisy", "polite"]


async def test_weights_share_grants_in_proportion():
    queue = PrefillQueue(max_waiting=100, clock=Clock())
    arrivals = [("heavy", 1, 3.0), ("light", 1, 1.0)] * 8
    order = await order_of_grants(queue, arrivals)
    assert order[:8].count("heavy") == 6 and order[:8].count("light") == 2


async def test_a_waiter_past_its_deadline_leaves_and_unblocks_the_rest():
    clock = Clock()
    queue = PrefillQueue(max_waiting=10, clock=clock)
    holder = await enter(queue, "a", 90)
    late = asyncio.create_task(enter(queue, "a", 50, deadline_s=0.05))
    small = asyncio.create_task(enter(queue, "b", 5))
    with pytest.raises(QueueDeadline):
        await asyncio.wait_for(late, 5)
    # The expired head no longer blocks a request that fits.
    (await asyncio.wait_for(small, 5)).release()
    holder.release()
    assert queue.admitted_tokens == 0 and queue.waiting == 0 and queue.waiting_tokens == 0


async def test_a_cancelled_waiter_leaves_nothing_behind():
    queue = PrefillQueue(max_waiting=10, clock=Clock())
    holder = await enter(queue, "a", 100)
    waiting = asyncio.create_task(enter(queue, "a", 10))
    await settle()
    waiting.cancel()
    await settle()
    assert queue.waiting == 0 and queue.waiting_tokens == 0
    holder.release()
    assert queue.admitted_tokens == 0


async def test_the_queue_length_is_capped():
    queue = PrefillQueue(max_waiting=2, clock=Clock())
    holder = await enter(queue, "a", 100)
    waiters = [asyncio.create_task(enter(queue, "a", 10)) for _ in range(2)]
    await settle()
    with pytest.raises(QueueFull):
        await enter(queue, "a", 10)
    holder.release()
    for grant in await asyncio.gather(*waiters):
        grant.release()


async def test_the_tokens_ahead_of_a_newcomer_are_its_fair_share_not_the_whole_queue():
    queue = PrefillQueue(max_waiting=100, clock=Clock())
    holder = await enter(queue, "x", 100)
    tasks = [asyncio.create_task(enter(queue, "noisy", 100)) for _ in range(10)]
    tasks.append(asyncio.create_task(enter(queue, "urgent", 100, priority=0)))
    await settle()
    # A polite tenant's next 100 tokens go after one of noisy's (equal weights) and every
    # higher-class request, not after all ten.
    assert queue.tokens_ahead(priority=1, tenant="polite", weight=1.0, cost=100) == 200
    assert queue.tokens_ahead(priority=1, tenant="noisy", weight=1.0, cost=100) == 1100
    assert queue.tokens_ahead(priority=2, tenant="polite", weight=1.0, cost=100) == 1100
    for task in tasks:
        task.cancel()
    await settle()
    holder.release()
    assert queue.waiting == 0


async def test_a_tenant_within_its_share_beside_one_over_its_own_is_sheltered():
    queue = PrefillQueue(max_waiting=10, clock=Clock())
    noisy = [await enter(queue, "noisy", 300, limit=1000) for _ in range(3)]  # 900 of 1000
    # Two tenants: 500 each. polite (100) is within its share, noisy (900) over its own.
    assert queue.sheltered("polite", 1.0, 100, 1000)
    assert not queue.sheltered("polite", 1.0, 600, 1000)  # this request puts it over
    assert not queue.sheltered("noisy", 1.0, 100, 1000)  # the one over its share
    # Weights split the limit: at 1:3, noisy's share is 250 and polite's 750.
    assert queue.sheltered("polite", 3.0, 700, 1000)
    for grant in noisy[:2]:
        grant.release()
    # noisy holds 300, within its 500: nobody is over, so nobody is sheltered.
    assert not queue.sheltered("polite", 1.0, 100, 1000)
    noisy[2].release()
    assert not queue.sheltered("noisy", 1.0, 100, 1000)  # alone, there is nobody to blame


async def test_batch_lines_hold_at_most_their_own_limit_of_the_queue():
    # Batch lines: together granted at most 30 of a 100 limit, one always when none is
    # admitted, whatever its cost; other work is not held back by their limit.
    queue = PrefillQueue(max_waiting=10, clock=Clock())

    def line(cost: int):
        return queue.enter(tenant="jobs", priority=2, weight=1.0, cost=cost, limit_tokens=100,
                           deadline_s=FAR, own_limit_tokens=30)  # fmt: skip

    alone = await line(50)
    alone.release()
    ahead = await enter(queue, "app", 20)
    first = await line(20)  # no batch work admitted: it goes beside the other work
    assert first.limited and queue.limited_tokens == 20
    second = asyncio.create_task(line(20))
    await settle()
    assert not second.done() and queue.waiting == 1  # 40 of batch work would be over 30
    assert not queue.waiting_above(2) and queue.waiting_above(3)  # it is class 2
    other = await enter(queue, "app", 50)  # a higher class: only the queue's limit holds it
    assert (queue.admitted_tokens, queue.limited_tokens) == (90, 20)
    ahead.release()
    other.release()
    await settle()
    assert not second.done()  # other work going changes nothing: batch work is at its limit
    first.release()
    await settle()
    assert second.done() and (queue.admitted_tokens, queue.limited_tokens) == (20, 20)
    (await second).release()
    assert (queue.admitted_tokens, queue.limited_tokens) == (0, 0)
