"""Router background loops: a crash is counted and the loop restarted; shutdown still stops it."""

from __future__ import annotations

import asyncio

import pytest

from router.fleet.background import keep_running


async def test_a_crashing_loop_is_restarted_until_it_finishes():
    runs, crashes = [], []

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise RuntimeError("a malformed something")

    await asyncio.wait_for(
        keep_running("t", loop, on_crash=crashes.append, first_delay_s=0.001), timeout=5
    )
    assert runs == [0, 1, 2]
    assert crashes == ["t", "t"]


async def test_cancellation_is_not_a_crash():
    crashes = []
    started = asyncio.Event()

    async def loop() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(keep_running("t", loop, on_crash=crashes.append))
    await asyncio.wait_for(started.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert crashes == []
