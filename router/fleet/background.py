"""Background loops that never die silently: a crash is logged, counted, and restarted.

A router loop that ends on an unexpected exception (a malformed KV event batch, a
bug in a probe) would otherwise leave its job undone with no sign: the prefix index
of a worker decays, health goes unchecked. ``keep_running`` restarts the loop after
a backoff that doubles up to ``max_delay_s`` and resets once a run has lasted
``stable_after_s``. Cancellation (shutdown) passes through untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("pdserve.router")


async def keep_running(
    name: str,
    loop: Callable[[], Awaitable[None]],
    *,
    on_crash: Callable[[str], None],
    first_delay_s: float = 0.5,
    max_delay_s: float = 30.0,
    stable_after_s: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run ``loop()`` until it returns, restarting it after every exception."""
    delay_s = first_delay_s
    while True:
        started_s = clock()
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            if clock() - started_s >= stable_after_s:
                delay_s = first_delay_s
            log.exception("background task %s crashed; restarting in %.1fs", name, delay_s)
            on_crash(name)
        await asyncio.sleep(delay_s)
        delay_s = min(2 * delay_s, max_delay_s)
