"""Taking batch prefills back from a worker (``router/orchestration/take_back.py``):
which calls are cancelled, and that a cancelled call is over before the line hears."""

from __future__ import annotations

import asyncio

import pytest

from router.orchestration.take_back import BatchPrefillHolds, TakenBack, unless_taken_back


def test_a_prompt_takes_back_the_batch_prefills_at_its_worker_only():
    async def scene() -> None:
        holds = BatchPrefillHolds()
        started = asyncio.Event()
        cancelled: list[str] = []

        async def engine_call(name: str) -> str:
            try:
                started.set()
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(name)
                raise
            return name

        async def line(worker: str, name: str) -> str:
            with holds.hold(worker) as taken:
                return await unless_taken_back(engine_call(name), taken)

        at_a = [asyncio.create_task(line("a", f"a{i}")) for i in range(2)]
        at_b = asyncio.create_task(line("b", "b0"))
        await asyncio.wait_for(started.wait(), 1)
        await asyncio.sleep(0)
        assert (holds.held("a"), holds.held("b")) == (2, 1)
        assert holds.take_back("a") == 2
        for task in at_a:
            with pytest.raises(TakenBack):
                await asyncio.wait_for(task, 1)
        assert sorted(cancelled) == ["a0", "a1"]  # each engine call was over first
        assert holds.held("a") == 0 and not at_b.done()
        assert holds.take_back("a") == 0  # nothing left there to take
        at_b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await at_b
        assert cancelled[-1] == "b0" and holds.held("b") == 0  # a line cancelled is let go

    asyncio.run(scene())


def test_a_call_that_ends_first_is_its_answer_and_its_hold_is_let_go():
    async def scene() -> None:
        holds = BatchPrefillHolds()
        with holds.hold("a") as taken:
            assert await unless_taken_back(asyncio.sleep(0, result="prefilled"), taken) == (
                "prefilled"
            )
        assert holds.held("a") == 0 and holds.take_back("a") == 0

    asyncio.run(scene())
