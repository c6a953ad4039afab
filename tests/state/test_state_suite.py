"""One suite, both backends: what every ControlState must do, against memory and a real
redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from localrun.redis_server import running_redis
from router.admission.token_bucket import BucketRate
from router.state.base import (
    AuditEntry,
    Change,
    ControlState,
    PoolTargets,
    StateConflict,
    StateFull,
    StateLimits,
)
from router.state.memory import MemoryState
from router.state.redis_backend import RedisState

LIMITS = StateLimits(
    max_workers=3,
    max_audit_entries=5,
    max_document_bytes=1024,
    max_review_items=3,
    max_batch_line_bytes=2048,
)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture(params=["memory", "redis"])
async def state(request: pytest.FixtureRequest) -> AsyncIterator[ControlState]:
    if request.param == "memory":
        backend: ControlState = MemoryState(LIMITS)
    else:
        url = request.getfixturevalue("redis_url")
        backend = RedisState(url, LIMITS, prefix=f"t{id(request)}")
    try:
        yield backend
    finally:
        await backend.close()


async def next_change(changes: AsyncIterator[Change], timeout_s: float = 5) -> Change:
    return await asyncio.wait_for(anext(changes), timeout_s)


async def test_worker_records_round_trip_and_are_removed(state: ControlState):
    await state.put_worker("w1", {"role": "prefill", "model": "m"}, ttl_s=30)
    await state.put_worker("w2", {"role": "decode", "model": "m"}, ttl_s=30)
    assert await state.workers() == {
        "w1": {"role": "prefill", "model": "m"},
        "w2": {"role": "decode", "model": "m"},
    }
    assert await state.worker("w2") == {"role": "decode", "model": "m"}
    assert await state.worker("nobody") is None
    assert await state.remove_worker("w1") is True
    assert await state.remove_worker("w1") is False
    assert list(await state.workers()) == ["w2"]


async def test_worker_count_is_capped_but_a_known_worker_renews(state: ControlState):
    for i in range(3):
        await state.put_worker(f"w{i}", {"i": i}, ttl_s=30)
    with pytest.raises(StateFull):
        await state.put_worker("w9", {}, ttl_s=30)
    await state.put_worker("w0", {"i": 100}, ttl_s=30)
    assert (await state.workers())["w0"] == {"i": 100}


async def test_oversized_records_and_documents_are_refused(state: ControlState):
    with pytest.raises(StateFull):
        await state.put_worker("w", {"blob": "x" * 2000}, ttl_s=30)
    with pytest.raises(StateFull):
        await state.put_document("routing", {"blob": "x" * 2000})
    assert await state.workers() == {} and await state.document("routing") is None


async def test_documents_are_versioned_whole(state: ControlState):
    assert await state.document("pools") is None
    assert await state.put_document("pools", {"m": {"prefill": 1}}) == 1
    assert await state.put_document("pools", {"m": {"prefill": 2}}) == 2
    assert await state.document("pools") == (2, {"m": {"prefill": 2}})
    assert await state.delete_document("pools") is True
    assert await state.delete_document("pools") is False
    assert await state.document("pools") is None


async def test_targets_per_model(state: ControlState):
    await state.set_targets("m", PoolTargets(prefill=2, decode=2))
    await state.set_targets("m", PoolTargets(prefill=3, decode=1))
    await state.set_targets("n", PoolTargets(prefill=1, decode=1))
    assert await state.targets() == {"m": PoolTargets(3, 1), "n": PoolTargets(1, 1)}


async def test_the_audit_log_keeps_the_newest_entries_in_order(state: ControlState):
    for i in range(7):
        entry = AuditEntry(
            at_unix_s=float(i), actor="sre", action="set_ratio", target="m", outcome="ok",
            detail={"step": i},
        )  # fmt: skip
        await state.append_audit(entry)
    entries = await state.audit(limit=100)
    assert [e.detail["step"] for e in entries] == [2, 3, 4, 5, 6]  # capped at 5
    assert [e.detail["step"] for e in await state.audit(limit=2)] == [5, 6]


async def test_every_write_is_announced(state: ControlState):
    changes = await state.subscribe()
    await state.put_worker("w1", {}, ttl_s=30)
    assert await next_change(changes) == Change("worker", "w1")
    await state.set_targets("m", PoolTargets(1, 1))
    assert await next_change(changes) == Change("targets", "m")
    await state.put_document("pools", {})
    assert await next_change(changes) == Change("config", "pools")
    await changes.aclose()


async def test_a_silent_worker_expires():
    clock = FakeClock()
    state = MemoryState(LIMITS, clock=clock)
    await state.put_worker("w1", {}, ttl_s=10)
    clock.now_s = 9.9
    assert list(await state.workers()) == ["w1"]
    clock.now_s = 10.0
    assert await state.workers() == {}


async def test_a_silent_worker_expires_in_redis(redis_url: str):
    state = RedisState(redis_url, LIMITS, prefix="ttl")
    try:
        await state.put_worker("w1", {}, ttl_s=0.2)
        assert list(await state.workers()) == ["w1"]
        deadline = asyncio.get_running_loop().time() + 5
        while await state.workers():  # Redis expires keys on its own clock: poll, bounded
            assert asyncio.get_running_loop().time() < deadline, "the record never expired"
            await asyncio.sleep(0.05)
    finally:
        await state.close()


async def test_two_replicas_on_one_redis_share_one_view(redis_url: str):
    one = RedisState(redis_url, LIMITS, prefix="shared")
    two = RedisState(redis_url, LIMITS, prefix="shared")
    try:
        changes = await two.subscribe()
        await one.set_targets("m", PoolTargets(prefill=3, decode=1))
        assert await next_change(changes) == Change("targets", "m")
        assert await two.targets() == {"m": PoolTargets(3, 1)}
        await changes.aclose()
    finally:
        await one.close()
        await two.close()


async def test_a_bucket_grants_its_capacity_then_says_how_long_to_wait(state: ControlState):
    rate = BucketRate(per_minute=6)  # capacity 6, one token every 10 s
    for _ in range(6):
        assert await state.take_tokens("tenant-a:rpm", 1, rate) == 0.0
    wait_s = await state.take_tokens("tenant-a:rpm", 1, rate)
    assert 9.0 < wait_s <= 10.0  # the refill since the first take is at most a few ms
    # Buckets are independent, and a refused take took nothing.
    assert await state.take_tokens("tenant-b:rpm", 6, rate) == 0.0
    assert 19.0 < await state.take_tokens("tenant-a:rpm", 2, rate) <= 20.0


async def test_replicas_share_one_bucket(redis_url: str):
    one, two = RedisState(redis_url, prefix="shared"), RedisState(redis_url, prefix="shared")
    try:
        rate = BucketRate(per_minute=4)
        taken = [await replica.take_tokens("t:rpm", 1, rate) for replica in (one, two) * 2]
        assert taken == [0.0] * 4
        assert await one.take_tokens("t:rpm", 1, rate) > 0
        assert await two.take_tokens("t:rpm", 1, rate) > 0
    finally:
        await one.close()
        await two.close()


async def test_a_document_written_against_a_stale_version_is_refused(state: ControlState):
    assert await state.put_document("routes", {"a": 1}, expected_version=0) == 1
    with pytest.raises(StateConflict):
        await state.put_document("routes", {"a": 2}, expected_version=0)
    assert await state.put_document("routes", {"a": 3}, expected_version=1) == 2
    with pytest.raises(StateConflict):
        await state.put_document("routes", {"a": 4}, expected_version=1)
    assert await state.document("routes") == (2, {"a": 3})


async def test_review_items_are_capped_marked_and_their_text_expires(state: ControlState):
    for n in range(4):
        await state.add_review({"id": f"r{n}", "check": "c"}, text=None, text_ttl_s=1)
    assert [i["id"] for i in await state.review_items(limit=10)] == ["r1", "r2", "r3"]
    assert await state.update_review("r2", {"mark": "harmful"}) == {
        "id": "r2",
        "check": "c",
        "mark": "harmful",
    }
    assert await state.update_review("r0", {"mark": "x"}) is None  # dropped by the cap
    await state.add_review({"id": "kept"}, text="the prompt", text_ttl_s=0.2)
    assert (await state.review_items(limit=1))[0]["text"] == "the prompt"
    if isinstance(state, MemoryState):
        state._clock = lambda: float("inf")  # the memory backend's clock
    else:
        await asyncio.sleep(0.4)  # Redis expires on the server's clock
    assert "text" not in (await state.review_items(limit=1))[0]


async def test_a_batch_line_is_kept_once_whoever_records_it(state: ControlState):
    assert await state.record_batch_line("b1", "line-1", '{"n": 1}')
    assert not await state.record_batch_line("b1", "line-1", '{"n": 2}')  # the first wins
    assert await state.record_batch_line("b1", "line-2", '{"n": 3}')
    assert await state.record_batch_line("b2", "line-1", '{"n": 4}')  # another batch's own
    assert await state.batch_lines("b1") == {"line-1": '{"n": 1}', "line-2": '{"n": 3}'}
    with pytest.raises(StateFull):
        await state.record_batch_line("b1", "big", "x" * (LIMITS.max_batch_line_bytes + 1))
    await state.drop_batch_lines("b1")
    assert await state.batch_lines("b1") == {}
    assert await state.batch_lines("b2") == {"line-1": '{"n": 4}'}
