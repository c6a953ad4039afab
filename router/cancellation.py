"""Work that stops when something else happens first (a client leaves, an interactive
prompt takes a worker back)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def unless(
    work: Awaitable[T], signal: Awaitable[object], stopped: Callable[[], BaseException]
) -> T:
    """``work``'s result; if ``signal`` completes first, ``work`` is cancelled and awaited
    (so its upstream calls are closed before the caller hears), then ``stopped()`` is
    raised. Cancelling the caller cancels both."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(signal)
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise stopped()
    return task.result()
