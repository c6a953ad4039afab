"""One simulated vLLM server: vLLM's HTTP API over a ``SimEngine``.

Roles follow vLLM's NixlConnector: a ``kv_producer`` answers ``do_remote_decode``
requests with a handoff in vLLM's ``kv_transfer_params`` shape and holds the
blocks under a lease; a ``kv_consumer`` given a handoff pulls the blocks from the
named producer with a real HTTP call (a dead producer is a real failure), waits
the profile's transfer time, then decodes. Like vLLM's default
``kv_load_failure_policy=fail``, a failed pull fails the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from contracts.block_hashing import engine_hash_seed, hash_function, none_hash
from contracts.tokenization import ModelTokenizer, load_tokenizer
from contracts.workers import SchedulingPolicy
from sim import DEFAULT_MAX_MODEL_LEN
from sim.engine import SimEngine, SimRequest
from sim.faults import SimFaults
from sim.kv_events import KVEventPublisher
from sim.metrics import SimMetrics
from sim.profile import TimingProfile

SimRole = Literal["colocated", "kv_producer", "kv_consumer"]
PULL_PATH = "/sim/kv/pull"
FAULTS_PATH = "/sim/faults"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    model_dir: str
    served_model_name: str
    role: SimRole = "colocated"
    host: str = "127.0.0.1"
    port: int
    profile: TimingProfile
    seed: int = 0
    kv_lease_s: float = 30.0
    hash_algo: str = "sha256"
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    kv_events_endpoint: str | None = None
    kv_events_bind: bool = False  # bind a named host too (pdserve's agents ask for it)
    faults: SimFaults = field(default_factory=SimFaults)
    # Bearer token for /sim/faults; agents pass theirs down. None: loopback trust.
    admin_token: str | None = None
    # vLLM's --stream-interval: tokens per streamed chunk (a request may ask for more).
    stream_interval: int = 1
    # vLLM's --scheduling-policy: "priority" orders waiting requests by their `priority`.
    scheduling_policy: SchedulingPolicy = "fcfs"


class SimServer:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine_id = str(uuid.uuid4())
        self.tokenizer: ModelTokenizer = load_tokenizer(config.model_dir)
        hash_fn = hash_function(config.hash_algo)
        self.engine = SimEngine(
            profile=config.profile,
            hash_fn=hash_fn,
            root_hash=none_hash(hash_fn, engine_hash_seed(os.environ)),  # as vLLM
            lease_s=config.kv_lease_s,
            clock=time.monotonic,
            scheduling_policy=config.scheduling_policy,
        )
        self.metrics = SimMetrics(self.engine, config.served_model_name)
        self._session: aiohttp.ClientSession | None = None
        self._engine_task: asyncio.Task | None = None
        self._publisher: KVEventPublisher | None = None
        self.faults = config.faults.model_copy()
        self._running = asyncio.Event()  # cleared while hung
        self._running.set()
        self.engine.slowdown = self.faults.slowdown
        self.engine.gate = self._running

    def __repr__(self) -> str:
        return f"SimServer({self.config.role}, port={self.config.port})"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_post(PULL_PATH, self.kv_pull)
        app.router.add_get(FAULTS_PATH, self.get_faults)
        app.router.add_post(FAULTS_PATH, self.set_faults)
        app.on_startup.append(self._start)
        app.on_shutdown.append(self._abort_in_flight)
        app.on_cleanup.append(self._stop)
        return app

    async def _abort_in_flight(self, _: web.Application) -> None:
        """As vLLM 0.32's engine core on SIGTERM (``--shutdown-timeout 0``): every request
        still running ends at once with ``finish_reason: "abort"``, its stream then closed
        with [DONE]. (What a real client gets also depends on vLLM's API server: in CI it
        was cut text, usage and [DONE] with no finish_reason; the router handles both.)"""
        for request in [*self.engine.waiting, *self.engine.running]:
            self.engine.abort(request)

    async def _start(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        if self.config.kv_events_endpoint:
            self._publisher = KVEventPublisher(
                self.config.kv_events_endpoint, bind=self.config.kv_events_bind
            )
            self.engine.publish_events = self._publish_events
        self._engine_task = asyncio.create_task(self.engine.run())
        self._engine_task.add_done_callback(_engine_died)

    async def _stop(self, _: web.Application) -> None:
        if self._engine_task:
            self._engine_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine_task
        if self._session:
            await self._session.close()
        if self._publisher:
            self._publisher.close()

    async def health(self, _: web.Request) -> web.Response:
        await self._running.wait()  # a hung engine never answers
        return web.Response()

    async def get_faults(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(401, "missing or invalid admin token", "AuthenticationError")
        return web.json_response(self.faults.model_dump())

    async def set_faults(self, request: web.Request) -> web.Response:
        """Merge the given fault fields into the current ones; refuse the whole update if bad."""
        if not self._authorized(request):
            return _error(401, "missing or invalid admin token", "AuthenticationError")
        try:
            update = await request.json()
            faults = SimFaults.model_validate({**self.faults.model_dump(), **update})
        except (ValueError, TypeError, ValidationError) as error:
            return _error(400, f"invalid faults: {error}")
        self.faults = faults
        self.engine.slowdown = faults.slowdown
        if faults.hang:
            self._running.clear()
        else:
            self._running.set()
        if faults.crash:
            os._exit(70)  # no cleanup, like a real crash; connections drop mid-stream
        return web.json_response(faults.model_dump())

    def _authorized(self, request: web.Request) -> bool:
        if not self.config.admin_token:
            return True
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.encode(), self.config.admin_token.encode()
        )

    def _publish_events(self, events: list) -> None:
        assert self._publisher is not None
        lost = random.random() < self.faults.kv_event_drop_probability
        self._publisher.publish(events, lost=lost)

    async def models(self, _: web.Request) -> web.Response:
        model = {"id": self.config.served_model_name, "object": "model", "owned_by": "pdserve-sim"}
        return web.json_response({"object": "list", "data": [model]})

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain")

    async def tokenize(self, http: web.Request) -> web.Response:
        """vLLM's ``/tokenize``: a completions ``prompt`` or chat ``messages``."""
        try:
            body = await http.json()
            chat = "messages" in body
            ids = self.tokenizer.request_ids(body, chat=chat)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return _error(400, f"invalid request: {error}")
        if body.get("model") not in (None, self.config.served_model_name):
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        return web.json_response(
            {"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids,
             "token_strs": None}
        )  # fmt: skip

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's dev-mode ``/reset_prefix_cache``: forget every cached block
        (subscribers get ``AllBlocksCleared``)."""
        if not self._authorized(request):
            return _error(401, "missing or invalid admin token", "AuthenticationError")
        self.engine.pool.clear()
        self.engine.publish_events(self.engine.pool.take_events())
        return web.Response()

    async def kv_pull(self, request: web.Request) -> web.Response:
        body = await request.json()
        lease = self.engine.release_lease(str(body.get("remote_request_id")))
        if lease is None:
            return _error(404, "no KV held for this request: unknown or its lease expired")
        return web.json_response({
            "num_tokens": lease.num_tokens,
            "block_hashes": [h.hex() for h in lease.prompt_hashes],
        })  # fmt: skip

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, http: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = await http.json()
            prompt_ids = self.tokenizer.request_ids(body, chat=chat)
            interval = stream_interval(self.config.stream_interval, body.get("stream_interval"))
            priority = int(body.get("priority") or 0)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return _error(400, f"invalid request: {error}")
        kv_params = body.get("kv_transfer_params") or {}
        refusal, max_tokens = self._refusal(body, prompt_ids)
        if refusal is not None:
            if kv_params.get("do_remote_prefill") and self.config.role == "kv_consumer":
                await self._release_refused(kv_params)
            return refusal
        # Like vLLM: the response is named after X-Request-Id when sent, and the engine's
        # own id adds a random suffix, so two requests under one X-Request-Id never collide.
        prefix = "chatcmpl" if chat else "cmpl"
        external = http.headers.get("X-Request-Id") or uuid.uuid4().hex
        request = SimRequest(
            request_id=f"{prefix}-{external}-{uuid.uuid4().hex[:8]}",
            response_id=f"{prefix}-{external}",
            prompt_token_ids=prompt_ids,
            output_token_ids=output_ids(
                self.tokenizer, int(body.get("seed") or self.config.seed), prompt_ids, max_tokens
            ),
            priority=priority,
        )
        if kv_params.get("do_remote_decode") and self.config.role == "kv_producer":
            request.hold_kv = True
            request.output_token_ids = request.output_token_ids[:1]
        if kv_params.get("do_remote_prefill") and self.config.role == "kv_consumer":
            failure = await self._pull(kv_params, prompt_ids)
            if failure:
                self.metrics.on_transfer_failed()
                return _error(500, failure, "InternalServerError")
            request.kv_pulled = True
        await asyncio.sleep(self.config.profile.request_overhead_ms / 1000)
        self.engine.add(request)
        self.metrics.on_arrival(request)
        try:
            if body.get("stream"):
                return await _stream(self, http, body, request, chat, interval)
            return await _whole(self, http, body, request, chat)
        finally:
            if request.finish_reason is None:
                self.engine.abort(request)  # the client left: free the slot and blocks

    def _refusal(
        self, body: dict[str, Any], prompt_ids: list[int]
    ) -> tuple[web.Response | None, int]:
        """vLLM's refusals after a request parsed, or none and the output cap."""
        if body.get("model") != self.config.served_model_name:
            return _error(404, f"The model `{body.get('model')}` does not exist.",
                          "NotFoundError"), 0  # fmt: skip
        if body.get("stream") and body.get("use_beam_search"):
            return _error(400, "Streaming is not currently supported with beam search"), 0
        limit = self.config.max_model_len
        if len(prompt_ids) > limit:
            return _error(400, f"This model's maximum context length is {limit} tokens. However, "
                          f"your prompt contains {len(prompt_ids)} input tokens."), 0  # fmt: skip
        # Like vLLM: an output cap beyond the context left is clamped to it, not refused.
        requested = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        max_tokens = min(requested, limit - len(prompt_ids))
        if max_tokens < 1:
            return _error(400, f"the prompt fills the {limit}-token context; no room for output"), 0
        return None, max_tokens

    async def _release_refused(self, params: dict[str, Any]) -> None:
        """Like vLLM 0.32's consumer (``notify_kv_transfer_request_rejected``): a refused
        request that carried a handoff tells its producer to free the held blocks."""
        assert self._session is not None
        url = f"http://{params.get('remote_host')}:{params.get('remote_port')}{PULL_PATH}"
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with self._session.post(url, json=params) as response:
                await response.read()

    async def _pull(self, params: dict[str, Any], prompt_ids: list[int]) -> str | None:
        """Fetch the prompt's KV from the producer; an error message on failure.

        The blocks must be this prompt's: a router that hands a decode another
        request's handoff gets a failed request here, as it would get wrong text
        from a real engine."""
        assert self._session is not None
        if random.random() < self.faults.transfer_failure_probability:
            return "KV transfer failed: injected fault"
        url = f"http://{params.get('remote_host')}:{params.get('remote_port')}{PULL_PATH}"
        started = time.monotonic()
        try:
            async with self._session.post(url, json=params) as response:
                if response.status != 200:
                    return f"KV transfer failed: producer answered {response.status}"
                held = await response.json()
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            return f"KV transfer failed: producer unreachable ({type(error).__name__})"
        hashes = self.engine.prompt_hashes(prompt_ids)
        if held.get("num_tokens") != len(prompt_ids) or held.get("block_hashes") != [
            h.hex() for h in hashes
        ]:
            return "KV transfer failed: the producer's blocks are another prompt's"
        # Only what this engine lacks crosses the link, as vLLM's pull asks for the prompt
        # less its locally cached tokens (the last one always comes over).
        profile = self.config.profile
        local = self.engine.pool.cached_prefix_blocks(hashes) * profile.block_size_tokens
        pulled = len(prompt_ids) - min(local, len(prompt_ids) - 1)
        transfer_s = profile.transfer_s(pulled)
        await asyncio.sleep(max(0.0, transfer_s - (time.monotonic() - started)))
        self.metrics.on_transfer(transfer_s, pulled * profile.kv_bytes_per_token)
        return None

    def handoff(self, request: SimRequest) -> dict[str, Any]:
        """vLLM's kv_transfer_params for a held request."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [[b.block_id for b in request.blocks]] if request.blocks else [[0]],
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_host": self.config.host,
            "remote_port": self.config.port,
            "tp_size": 1,
            "remote_num_tokens": len(request.prompt_token_ids),
            "transfer_mode": "pull",
        }


def output_ids(
    tokenizer: ModelTokenizer, seed: int, prompt_ids: list[int], count: int
) -> list[int]:
    """The sim's deterministic 'generation': ordinary vocabulary tokens, each a function of
    the seed and the whole context before it, as a greedy model's would be. So the prompt
    plus the first k outputs, sent as a new prompt, goes on with output k+1 onwards (a
    migrated stream continues exactly)."""
    state = seed & _MASK
    for token in prompt_ids:
        state = _mixed(state, token)
    ids: list[int] = []
    while len(ids) < count:
        draw = _mixed(state, 0)
        while (token := (draw >> 24) % tokenizer.vocab_size) in tokenizer.special_ids:
            draw = _mixed(draw, 1)
        ids.append(token)
        state = _mixed(state, token)  # as the prompt's tokens were taken in
    return ids


_MASK = (1 << 64) - 1


def _mixed(state: int, token: int) -> int:
    """A 64-bit linear congruential step that takes in one token (Knuth's MMIX constants)."""
    return (state * 6364136223846793005 + 1442695040888963407 + token) & _MASK


async def _tokens(request: SimRequest) -> AsyncIterator[int]:
    while (token := await request.tokens.get()) is not None:
        yield token


async def _whole(
    server: SimServer, http: web.Request, body: dict, request: SimRequest, chat: bool
) -> web.Response:
    ids: list[int] = []
    async for token in _tokens(request):  # timed as streamed ones are, as vLLM does
        server.metrics.on_token(request, not ids)
        ids.append(token)
    held = server.engine.leases.get(request.request_id)
    text = "".join(server.tokenizer.decode_one(t) for t in ids)
    choice: dict[str, Any] = {"index": 0, "finish_reason": request.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    if body.get("return_token_ids"):
        choice["token_ids"] = ids
    payload = _envelope(server, request, chat, [choice])
    payload["usage"] = _usage(request)
    if held is not None:
        request.blocks = held.blocks  # only to name the block ids in the handoff
        payload["kv_transfer_params"] = server.handoff(request)
        request.blocks = []
    server.metrics.on_finished(request)
    return web.json_response(payload)


def stream_interval(server_interval: int, asked: object) -> int:
    """Tokens per streamed chunk: like vLLM, a request's ``stream_interval`` raises the
    server's and never lowers it."""
    if asked is None:
        return server_interval
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise ValueError("stream_interval must be an integer of at least 1")
    return max(asked, server_interval)


async def _stream(
    server: SimServer,
    http: web.Request,
    body: dict,
    request: SimRequest,
    chat: bool,
    interval: int,
) -> web.StreamResponse:
    """Like vLLM's output processor: the first token and the last are sent at once, the
    rest ``interval`` tokens to a chunk."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(http)
    first = True
    held: list[int] = []
    # vLLM's token id fields: always there, null unless asked.
    asked = bool(body.get("return_token_ids"))

    async def send_held(finished: bool) -> None:
        if chat and first:  # like vLLM: the role first, with the prompt's ids at the top
            delta = {"role": "assistant", "content": ""}
            role = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            role_chunk = _envelope(server, request, chat, [role], chunk=True)
            role_chunk["prompt_token_ids"] = request.prompt_token_ids if asked else None
            await _send(response, role_chunk)
        text = "".join(server.tokenizer.decode_one(t) for t in held)
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None,
                                      "finish_reason": None}  # fmt: skip
        else:
            choice = {"index": 0, "text": text, "finish_reason": None}
            choice["prompt_token_ids"] = request.prompt_token_ids if asked and first else None
        choice["token_ids"] = list(held) if asked else None
        if finished:
            choice["finish_reason"] = request.finish_reason
        await _send(response, _envelope(server, request, chat, [choice], chunk=True))

    async for token in _tokens(request):
        server.metrics.on_token(request, first)
        held.append(token)
        # Only the end marker left: this is the last token.
        finished = request.finish_reason is not None and request.tokens.qsize() == 1
        if first or finished or len(held) >= interval:
            await send_held(finished)
            first, held = False, []
    if held or request.finish_reason == "abort":  # nothing dropped; vLLM says "abort"
        await send_held(True)
    if (body.get("stream_options") or {}).get("include_usage"):
        usage_chunk = _envelope(server, request, chat, [], chunk=True)
        usage_chunk["usage"] = _usage(request)
        await _send(response, usage_chunk)
    await response.write(b"data: [DONE]\n\n")
    server.metrics.on_finished(request)
    return response


async def _send(response: web.StreamResponse, payload: dict) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def _envelope(
    server: SimServer, request: SimRequest, chat: bool, choices: list, *, chunk: bool = False
) -> dict:
    # vLLM's names: chat chunks have their own object type; completion chunks do not.
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {
        "id": request.response_id or request.request_id,
        "object": kind,
        "created": int(time.time()),
        "model": server.config.served_model_name,
        "choices": choices,
    }


def _usage(request: SimRequest) -> dict[str, int]:
    prompt = len(request.prompt_token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": request.generated,
        "total_tokens": prompt + request.generated,
    }


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    error = {"message": message, "type": kind, "param": None, "code": status}
    return web.json_response({"error": error}, status=status)


def _engine_died(task: asyncio.Task) -> None:
    """An engine loop that raised would leave every request waiting forever, silently.
    Like vLLM when its engine core dies: say why and exit, so the agent restarts it."""
    if task.cancelled() or task.exception() is None:
        return
    logging.getLogger("pdserve.sim").critical(
        "sim engine loop crashed; exiting", exc_info=task.exception()
    )
    os._exit(1)
