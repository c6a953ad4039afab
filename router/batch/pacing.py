"""How many of a batch's lines are in flight at once: more while interactive traffic
leaves room, fewer at once when it does not. Additive increase, multiplicative decrease,
as TCP paces a flow on a shared link; the signal is admission's refusal of a line for
want of room (its queue wait ran out, decode KV full, a rate limit: 429/503). A yield to
interactive traffic (``batch_yields``) is not one: the queue already holds batch lines
back while prefill is busy, and such yields come and go with every burst.

Invariants:
- ``floor <= limit <= cap``. ``in_flight`` exceeds ``limit`` only after a cut: lines
  already sent finish, and no new one starts until ``in_flight`` is below the limit.
- One cut per round: a refusal of a line sent before the last cut is old news and cuts
  nothing, so a burst of refusals halves the limit once, not down to the floor.
- The limit grows for each line answered that saw every slot taken while it was in
  flight: by one until the first refusal (slow start: it doubles every round trip of a
  full window, so a batch on an idle pool is soon at full pace), by ``1 / limit`` after
  (about one more line per round trip). An answer while slots stayed free says nothing
  about room for more.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Send:
    """One line's hold on a slot: the round it was sent in, and how many times the
    window had filled before."""

    round: int
    fills: int


class LinePacer:
    def __init__(self, *, cap: int, floor: int = 1, initial: int = 1) -> None:
        """``initial``: the limit before any answer (within floor and cap)."""
        if not 1 <= floor <= cap:
            raise ValueError(f"need 1 <= floor ({floor}) <= cap ({cap})")
        self._cap = cap
        self._floor = floor
        self._limit = float(min(cap, max(floor, initial)))
        self._in_flight = 0
        self._round = 0
        self._fills = 0  # times every slot was taken
        self._slow_start = True  # until the first refusal
        self._changed = asyncio.Condition()

    def __repr__(self) -> str:
        return f"LinePacer(in_flight={self._in_flight}, limit={self.limit}/{self._cap})"

    @property
    def limit(self) -> int:
        return int(self._limit)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def take(self) -> Send:
        """Wait for a free slot, then hold it."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._in_flight < self.limit)
            return self._hold()

    def _hold(self) -> Send:
        send = Send(self._round, self._fills)
        self._in_flight += 1
        self._fills += self._in_flight >= self.limit
        return send

    async def refused(self, send: Send) -> Send:
        """The line was refused for want of room: cut the limit (once per round). The line
        keeps its slot to try again if it is still within the limit; else it gives the
        slot back and waits for one."""
        self._slow_start = False
        if send.round == self._round:
            self._round += 1
            self._limit = max(float(self._floor), self._limit / 2)
        if self._in_flight <= self.limit:
            return Send(self._round, self._fills)
        await self.give_back(grew=False, send=send)
        return await self.take()

    async def give_back(self, *, grew: bool, send: Send) -> None:
        """The line is done with its slot; ``grew``: it was answered, so if the window
        filled while it was in flight, the limit grows."""
        async with self._changed:
            self._in_flight -= 1
            if grew and self._fills > send.fills and send.round == self._round:
                step = 1.0 if self._slow_start else 1 / self._limit
                self._limit = min(float(self._cap), self._limit + step)
            self._changed.notify_all()

    async def raise_floor(self, floor: int) -> None:
        """Never fewer than ``floor`` lines at once (a batch at risk of missing its window;
        1 again once it is not)."""
        async with self._changed:
            self._floor = max(1, min(self._cap, floor))
            self._limit = max(self._limit, float(self._floor))
            self._changed.notify_all()
