"""An asyncio event loop on simulated time: the sim's engines run an hour in seconds.

The engine loop waits on ``asyncio.sleep(step_s)``; on this loop a sleep takes no wall
time. When nothing is ready to run, the loop does not block: it moves its clock to the
next timer and runs it. Everything in the loop sees that clock (``loop.time()``), so
code written for real time (the sim's engines, a controller polling every 30 s) runs
unchanged and in the same order it would, only without the waiting.

Invariants:
- time never goes backwards, and only moves while nothing is ready to run;
- no real I/O: the loop may only wait on timers. Waiting with no timer pending would
  wait forever, so it raises ``RuntimeError`` (a deadlock in the simulated system)
  instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.BaseSelector):
    """A selector whose wait moves the loop's clock instead of blocking."""

    def __init__(self) -> None:
        self._inner = selectors.DefaultSelector()
        self.now_s = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("simulated time: every task waits and no timer is pending")
        self.now_s += max(0.0, timeout)
        return self._inner.select(0)

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


class FastForwardLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(selector=self._jumping)

    def time(self) -> float:
        return self._jumping.now_s


def run_fast_forward(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on simulated time; ``asyncio.get_running_loop().time()``
    is the simulated clock, starting at 0."""
    loop = FastForwardLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
