"""Freeing a producer's held KV at once when no decode will pull it.

vLLM 0.32's NixlConnector keeps a finished prefill's blocks until a consumer pulls them
or their lease runs out (``kv_lease_s``, 30 s), and has no API to free them sooner. It has
one path that does: when a consumer's serving layer refuses a request that carries a
handoff (``create_completion`` returns an error), it submits that request to its engine
pre-aborted (``notify_kv_transfer_request_rejected``), and its connector tells the
producer, over NIXL, to free the blocks.

So when a handoff will never be pulled (its decode failed before its first byte and the
request goes on without it), the router sends it to a live decode engine inside a request
that engine refuses before it schedules anything: a streamed beam search ("Streaming is
not currently supported with beam search"). The connector tells the producer from its
next engine step, and an idle engine takes none: so a one-token request follows, which
makes it step (measured on vLLM 0.32: without it, the blocks waited out the 30 s lease on
an idle decode; with it, they were free at once). A release runs beside the request and
never delays it; one that fails (no live consumer, a timeout) leaves the lease to free the
blocks, as before. At most ``_MAX_IN_FLIGHT`` run at once, so a failure storm cannot
turn into a release storm.

Not covered: a pull that fails inside the consumer. With the shipped
``kv_load_failure_policy: "recompute"`` the decode computes the prompt itself and
answers 200, so the router never learns of it, and vLLM's consumer does not notify the
producer after a failed read: those blocks wait out the lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from kvtransfer.handoff import KVHandoff
from router.orchestration.engine_client import EngineClient
from router.orchestration.engine_errors import EngineHTTPError, EngineUnreachable

log = logging.getLogger("pdserve.router")

_MAX_IN_FLIGHT = 64
RELEASE_PATH = "/v1/completions"


def release_body(model: str, handoff: KVHandoff) -> bytes:
    """A request a consumer refuses at its serving layer, carrying ``handoff``."""
    return json.dumps({
        "model": model, "prompt": "release", "max_tokens": 1, "stream": True,
        "use_beam_search": True, "kv_transfer_params": handoff.to_decode_params(),
    }).encode()  # fmt: skip


def step_body(model: str) -> bytes:
    """The least request that makes an idle engine take a step."""
    return json.dumps({"model": model, "prompt": ".", "max_tokens": 1}).encode()


class KVReleases:
    """Sends orphaned handoffs to live consumers to be refused (and so freed)."""

    def __init__(
        self, engines: EngineClient, *, timeout_s: float, on_outcome: Callable[[str], None]
    ) -> None:
        self._engines = engines
        self._timeout_s = timeout_s
        self._on_outcome = on_outcome
        self._running: set[asyncio.Task[None]] = set()

    def release(self, model: str, handoff: KVHandoff, consumer_url: str | None) -> None:
        """Free ``handoff``'s blocks through the decode engine at ``consumer_url``."""
        if consumer_url is None:
            self._on_outcome("no_consumer")
            return
        if len(self._running) >= _MAX_IN_FLIGHT:
            self._on_outcome("skipped")
            return
        task = asyncio.get_running_loop().create_task(self._send(consumer_url, model, handoff))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _send(self, consumer_url: str, model: str, handoff: KVHandoff) -> None:
        url = consumer_url + RELEASE_PATH
        try:
            await self._engines.post_json(url, release_body(model, handoff),
                                          timeout_s=self._timeout_s)  # fmt: skip
        except EngineHTTPError as refused:
            if refused.status == 400:  # refused before scheduling: the producer is told
                await self._step(url, model)
                self._on_outcome("released")
                return
            log.warning("KV release via %s answered %d", consumer_url, refused.status)
        except EngineUnreachable as error:
            log.warning("KV release via %s failed: %s", consumer_url, error)
        else:
            log.warning("KV release via %s was accepted, not refused", consumer_url)
        self._on_outcome("failed")

    async def _step(self, url: str, model: str) -> None:
        try:
            await self._engines.post_json(url, step_body(model), timeout_s=self._timeout_s)
        except (EngineHTTPError, EngineUnreachable) as error:
            log.warning("KV release: the step request to %s failed: %s", url, error)

    async def close(self) -> None:
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
