"""The batch pacer: more lines in flight while they are taken, half as many at once when
one is refused, one cut per round, and a floor for a batch at risk."""

from __future__ import annotations

import asyncio

import pytest

from router.batch.pacing import LinePacer


async def _fill(pacer: LinePacer):
    return [await pacer.take() for _ in range(pacer.limit - pacer.in_flight)]


async def _grow_to(pacer: LinePacer, limit: int) -> None:
    """Answer full windows until the limit reaches ``limit``."""
    while pacer.limit < limit:
        for send in await _fill(pacer):
            await pacer.give_back(grew=True, send=send)


async def _windows_to(pacer: LinePacer, limit: int) -> int:
    windows = 0
    while pacer.limit < limit:
        for send in await _fill(pacer):
            await pacer.give_back(grew=True, send=send)
        windows += 1
    return windows


async def test_full_windows_double_the_limit_until_a_refusal_then_add_about_one_each():
    pacer = LinePacer(cap=64)
    assert pacer.limit == 1
    assert await _windows_to(pacer, 16) == 4  # 1, 2, 4, 8, 16
    await pacer.refused(await pacer.take())  # cut to 8; this line keeps its slot
    assert pacer.limit == 8
    for send in await _fill(pacer):
        await pacer.give_back(grew=True, send=send)
    assert pacer.limit == 8  # past the cut, 1/limit an answer: 7 answers are not one more
    assert 7 <= await _windows_to(pacer, 16) <= 9


async def test_answers_with_free_slots_do_not_grow_it_and_it_stops_at_the_cap():
    pacer = LinePacer(cap=4)
    await _grow_to(pacer, 2)
    send = await pacer.take()  # one of two slots: the window never fills
    for _ in range(10):
        await pacer.give_back(grew=True, send=send)
        send = await pacer.take()
    assert pacer.limit == 2
    await pacer.give_back(grew=False, send=send)
    await _grow_to(pacer, 4)
    for send in await _fill(pacer):
        await pacer.give_back(grew=True, send=send)
    assert pacer.limit == 4


async def _settle() -> None:
    for _ in range(50):  # no clock involved: every ready task gets to run
        await asyncio.sleep(0)


async def test_a_burst_of_refusals_in_one_round_halves_the_limit_once():
    pacer = LinePacer(cap=16)
    await _grow_to(pacer, 8)
    sends = await _fill(pacer)
    retries = [asyncio.create_task(pacer.refused(send)) for send in sends]
    await _settle()
    assert pacer.limit == 4
    kept = [task.result() for task in retries if task.done()]
    assert len(kept) == 4 and pacer.in_flight == 4  # the rest wait for a slot
    # Refused again in the new round: that is news, and cuts once more.
    retries.append(asyncio.create_task(pacer.refused(kept[0])))
    await _settle()
    assert pacer.limit == 2
    for task in retries:
        task.cancel()


async def test_past_the_cut_a_refused_line_waits_for_a_slot_and_nothing_new_starts():
    pacer = LinePacer(cap=8)
    await _grow_to(pacer, 4)
    sends = await _fill(pacer)
    waiting = [asyncio.create_task(pacer.refused(send)) for send in sends[:2]]
    await _settle()
    assert pacer.limit == 2 and pacer.in_flight == 2  # both gave their slots back
    assert not any(task.done() for task in waiting)
    kept = await pacer.refused(sends[2])  # within the limit now: it keeps its slot
    newcomer = asyncio.create_task(pacer.take())
    await _settle()
    assert pacer.in_flight == 2 and not newcomer.done()
    await pacer.give_back(grew=True, send=sends[3])
    await pacer.give_back(grew=True, send=kept)
    await _settle()
    assert all(task.done() for task in waiting) and not newcomer.done()  # first come
    assert pacer.in_flight == 2
    newcomer.cancel()


async def test_a_raised_floor_holds_the_limit_through_refusals():
    pacer = LinePacer(cap=8)
    await pacer.raise_floor(4)
    assert pacer.limit == 4
    sends = await _fill(pacer)
    await pacer.refused(sends[0])
    assert pacer.limit == 4


def test_a_floor_over_the_cap_is_refused():
    with pytest.raises(ValueError, match="floor"):
        LinePacer(cap=2, floor=3)


async def test_it_starts_at_its_initial_limit_within_the_cap_and_halves_from_there():
    assert LinePacer(cap=2, initial=4).limit == 2
    pacer = LinePacer(cap=32, initial=4)
    sends = await _fill(pacer)
    assert len(sends) == pacer.in_flight == 4
    waiting = asyncio.create_task(pacer.refused(sends[0]))
    await _settle()
    assert pacer.limit == 2 and not waiting.done()  # 3 still out: it waits for a slot
    waiting.cancel()
