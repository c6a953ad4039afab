"""The router's pooled HTTP clients: ``engines`` (``engine_client.py``) for the calls on
the request path, and an aiohttp session for the rest (health probes, safety hooks, which
may be https). aiohttp, not httpx: it measured 4-6x cheaper per request here.

Pooled keep-alive connections go stale when the engine closes them first (vLLM's
uvicorn closes idle ones after ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``). A request that
fails on such a connection before any answer byte never reached the engine, so it
is resent once on a fresh connection instead of failing a healthy worker. Failures are
split so the orchestrator can decide: ``EngineUnreachable`` means the worker
may be dead (retry elsewhere, mark unhealthy); ``EngineHTTPError`` means the
engine answered and refused.
"""

from __future__ import annotations

import asyncio

import aiohttp

from contracts.logs import REQUEST_ID_HEADER, request_id_var
from router.orchestration.engine_client import EngineClient
from router.orchestration.engine_errors import EngineHTTPError, EngineUnreachable

JSON_HEADERS = {"Content-Type": "application/json"}
_ID = REQUEST_ID_HEADER  # vLLM names its request after it (cmpl-<id>), on both engines


def _stale_connection(error: BaseException) -> bool:
    """A reused connection the peer had closed: the request was never processed."""
    if isinstance(error, aiohttp.ClientConnectorError):
        return False  # a fresh connect that failed: the engine is really unreachable
    return isinstance(error, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))


class Upstream:
    def __init__(self, *, pool_size: int, connect_timeout_s: float, keepalive_s: float) -> None:
        self._pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self.engines = EngineClient(
            pool_size=pool_size, connect_timeout_s=connect_timeout_s, keepalive_s=keepalive_s
        )

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._pool_size, ttl_dns_cache=300, keepalive_timeout=self._keepalive_s
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=self._connect_timeout_s),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        self.engines.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Upstream.start() was not awaited"
        return self._session

    async def _send(
        self, url: str, body: bytes, timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        """POST until the answer's headers arrive, resending once after a stale connection."""
        request_id = request_id_var.get()
        headers = JSON_HEADERS if request_id is None else {**JSON_HEADERS, _ID: request_id}
        for attempt in range(2):
            try:
                return await self.session.post(url, data=body, headers=headers, timeout=timeout)
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                if attempt == 0 and _stale_connection(error):
                    continue
                raise EngineUnreachable(f"{url}: {error!r}") from error
        raise AssertionError("unreachable")

    async def post_json(self, url: str, body: bytes, *, timeout_s: float) -> bytes:
        """POST and read the whole answer; raise on any non-200."""
        response = await self._send(url, body, aiohttp.ClientTimeout(total=timeout_s))
        try:
            async with response:
                payload = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            raise EngineUnreachable(f"{url}: {error!r}") from error
        if response.status != 200:
            raise EngineHTTPError(response.status, payload)
        return payload
