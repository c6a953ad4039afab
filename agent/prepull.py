"""Pull a version the router orders beside the one this worker serves (a canary's
pre-pull, router/rollout/prepull.py), so that the node's cache holds it before any pod
of that version needs it. Nothing restarts; the engine keeps serving.

One pull at a time, in a thread (the copy and the checksum are blocking I/O). A failed
pull is not retried for ``RETRY_AFTER_S``, however often the order comes. Only where a
pull placed the served model (``CACHE/<model>/<version>`` with its record): an agent
started on any other folder has no cache to pull into and ignores orders.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from contracts.workers import PullOrder
from modelstore.pull import PullError, pull, pulled_versions, read_record

log = logging.getLogger("pdserve.agent")

RETRY_AFTER_S = 60.0


class Prepuller:
    def __init__(self, served_folder: Path) -> None:
        self._folder = served_folder
        self._task: asyncio.Task[None] | None = None
        self._failed_at: dict[str, float] = {}
        self._in_cache = read_record(served_folder) is not None

    def __repr__(self) -> str:
        pulling = self._task is not None and not self._task.done()
        return f"Prepuller({self._folder}, pulling={pulling})"

    def versions(self) -> tuple[str, ...]:
        return pulled_versions(self._folder) if self._in_cache else ()

    def order(self, order: PullOrder) -> None:
        if not self._in_cache:
            return
        if self._task is not None and not self._task.done():
            return
        failed_at = self._failed_at.get(order.version)
        if failed_at is not None and time.monotonic() - failed_at < RETRY_AFTER_S:
            return
        if order.version in self.versions():
            return
        self._task = asyncio.get_running_loop().create_task(self._pull(order))

    async def _pull(self, order: PullOrder) -> None:
        log.info("pre-pulling %s %s from %s", self._folder.parent.name, order.version,
                 order.artifact)  # fmt: skip
        try:
            await asyncio.to_thread(
                pull, order.artifact, model=self._folder.parent.name, version=order.version,
                checksum=order.checksum, cache=self._folder.parent.parent, progress=log.info,
            )  # fmt: skip
        except (PullError, OSError) as error:
            log.warning("pre-pull of %s failed: %s", order.version, error)
            self._failed_at[order.version] = time.monotonic()
