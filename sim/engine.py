"""The simulator's engine loop: continuous batching over a paged, prefix-cached KV pool.

Each step runs every decoding sequence one token forward and spends what is left
of ``max_num_batched_tokens`` on prefill chunks: the running requests' first, then
waiting ones in order (chunked prefill). The step lasts as long as the profile says
for that batch shape, then its tokens are emitted. When KV runs out mid-decode a
running request is preempted: its blocks are freed and it waits to be recomputed, as
in vLLM. The order is vLLM's ``--scheduling-policy``: ``fcfs`` takes waiting requests
oldest first and preempts the newest; ``priority`` takes them by (``priority``,
arrival), lower first, and preempts the one last in that order.

A producer (``hold_kv``) keeps a finished request's blocks under a lease until a
consumer pulls them or the lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from bisect import insort
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from contracts.block_hashing import BlockHash, HashFn, block_hashes
from contracts.workers import SchedulingPolicy
from sim.kv_cache import Block, KVBlockPool
from sim.profile import TimingProfile


@dataclass(slots=True, eq=False)
class SimRequest:
    request_id: str  # unique in this engine, like vLLM's internal id
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # decided up front: deterministic from (seed, prompt)
    hold_kv: bool = False  # producer: keep the blocks for a remote decode
    kv_pulled: bool = False  # consumer: the prompt's KV arrived over the transfer
    computed_tokens: int = 0
    generated: int = 0
    blocks: list[Block] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)
    tokens: asyncio.Queue = field(default_factory=asyncio.Queue)  # int per token; None: end
    finish_reason: str | None = None
    response_id: str = ""  # what the client sees: vLLM's cmpl-<X-Request-Id>
    priority: int = 0  # vLLM's request priority: lower goes first (policy "priority")
    arrival: int = 0  # set by the engine: ties between equal priorities go oldest first

    @property
    def prefilled(self) -> bool:
        return self.computed_tokens >= len(self.prompt_token_ids)


@dataclass(slots=True)
class Lease:
    blocks: list[Block]
    num_tokens: int
    expires_s: float
    # The prompt's full-block hashes: what a consumer checks the KV belongs to its prompt by.
    prompt_hashes: tuple[BlockHash, ...] = ()


@dataclass(slots=True)
class EngineStats:
    """Counters with vLLM's meaning; the server exposes them under vLLM's names (and
    ``busy_s``, which vLLM lacks, under the sim's own)."""

    prompt_tokens_by_source: Counter = field(default_factory=Counter)
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # vLLM's external_prefix_cache_*: prompt tokens asked of the KV connector, and pulled.
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    finished: Counter = field(default_factory=Counter)
    preemptions: int = 0
    steps: int = 0
    busy_s: float = 0.0  # the sim's own (vLLM has none): seconds spent in steps


class SimEngine:
    def __init__(
        self,
        *,
        profile: TimingProfile,
        hash_fn: HashFn,
        root_hash: BlockHash,
        lease_s: float,
        clock: Callable[[], float],
        scheduling_policy: SchedulingPolicy = "fcfs",
    ) -> None:
        self.profile = profile
        self.scheduling_policy = scheduling_policy
        self._arrivals = itertools.count()
        self.pool = KVBlockPool(num_blocks=profile.num_blocks, block_size=profile.block_size_tokens)
        self.stats = EngineStats()
        self.slowdown = 1.0  # fault injection: multiply every step's time
        self._hash_fn = hash_fn
        self._root_hash = root_hash
        self._lease_s = lease_s
        self._clock = clock
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.leases: dict[str, Lease] = {}
        self._wakeup = asyncio.Event()
        # Where KV events go after each step (a ZMQ publisher, or nowhere).
        self.publish_events: Callable[[list], None] = lambda events: None
        self.gate = asyncio.Event()  # cleared: the engine hangs before its next step
        self.gate.set()

    def __repr__(self) -> str:
        return f"SimEngine(running={len(self.running)}, waiting={len(self.waiting)})"

    def prompt_hashes(self, prompt_token_ids: list[int]) -> list[BlockHash]:
        """The prompt's full-block hashes, as this engine's prefix cache computes them."""
        return block_hashes(prompt_token_ids, self.pool.block_size, self._hash_fn, self._root_hash)

    def add(self, request: SimRequest) -> None:
        request.hashes = self.prompt_hashes(request.prompt_token_ids)
        request.arrival = next(self._arrivals)
        self._wait(request)
        self._wakeup.set()

    def _order(self, request: SimRequest) -> tuple[int, int]:
        """Under the priority policy, waiting requests go in this order, and the running
        one last in it is preempted first."""
        first = request.priority if self.scheduling_policy == "priority" else 0
        return first, request.arrival

    def _wait(self, request: SimRequest) -> None:
        insort(self.waiting, request, key=self._order)

    def abort(self, request: SimRequest) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
        self._finish(request, "abort")

    def release_lease(self, request_id: str) -> Lease | None:
        """A consumer pulled the KV: free it. None if unknown or expired."""
        self._reap_leases()
        lease = self.leases.pop(request_id, None)
        if lease is None:
            return None
        self.pool.free(lease.blocks)
        return lease

    async def run(self) -> None:
        while True:
            await self.gate.wait()
            self._reap_leases()
            if not self.running and not self.waiting:
                self._wakeup.clear()
                # Idle, but held leases still expire on time (and free their blocks).
                next_expiry_s = min((lease.expires_s for lease in self.leases.values()),
                                    default=None)  # fmt: skip
                timeout_s = None if next_expiry_s is None else next_expiry_s - self._clock()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout_s)
                continue
            prefill_chunks, decoding = self._schedule()
            if not prefill_chunks and not decoding:
                # Nothing fits (KV full of leases): wait for a lease to go.
                await asyncio.sleep(0.05)
                continue
            step_s = self.profile.step_s(
                prefill_chunks=[(chunk, r.computed_tokens) for r, chunk in prefill_chunks],
                decode_seqs=len(decoding),
                decode_context_tokens=sum(len(r.prompt_token_ids) + r.generated for r in decoding),
            )
            await asyncio.sleep(step_s * self.slowdown)
            self.stats.busy_s += step_s * self.slowdown
            self._complete(prefill_chunks, decoding)
            self.publish_events(self.pool.take_events())

    def _schedule(self) -> tuple[list[tuple[SimRequest, int]], list[SimRequest]]:
        budget = self.profile.max_num_batched_tokens
        decoding: list[SimRequest] = []
        for request in list(self.running):
            if not request.prefilled or request not in self.running:
                continue
            if not self._room_for_next_token(request):
                continue  # preempted itself
            decoding.append(request)
            budget -= 1
        prefill_chunks: list[tuple[SimRequest, int]] = []
        for request in self.running:
            if not request.prefilled and budget > 0:
                chunk = min(len(request.prompt_token_ids) - request.computed_tokens, budget)
                prefill_chunks.append((request, chunk))
                budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < self.profile.max_num_seqs:
            request = self.waiting[0]
            if not self._admit(request):
                break
            self.waiting.popleft()
            self.running.append(request)
            if not request.prefilled:
                chunk = min(len(request.prompt_token_ids) - request.computed_tokens, budget)
                prefill_chunks.append((request, chunk))
                budget -= chunk
            elif self._room_for_next_token(request):
                decoding.append(request)
                budget -= 1
        return prefill_chunks, decoding

    def _admit(self, request: SimRequest) -> bool:
        prompt_len = len(request.prompt_token_ids)
        needed = math.ceil((prompt_len + 1) / self.pool.block_size)
        blocks = self.pool.allocate(request.hashes, needed)
        if blocks is None:
            return False
        request.blocks = blocks
        cached_blocks = self.pool.cached_prefix_blocks(request.hashes)
        self.stats.prefix_cache_queries += prompt_len
        # Like vLLM, the last prompt token is always recomputed to sample from (or pulled).
        cached = min(cached_blocks * self.pool.block_size, prompt_len - 1)
        if request.kv_pulled:
            # The connector pulled what this engine lacked (vLLM's pull asks for the prompt
            # less its locally computed tokens). Pulled KV lands in the prefix cache like
            # computed KV (vLLM caches the blocks a connector loads): a later turn hits it.
            request.computed_tokens = prompt_len
            self.stats.prefix_cache_hits += cached
            self.stats.prompt_tokens_by_source["local_cache_hit"] += cached
            self.stats.prompt_tokens_by_source["external_kv_transfer"] += prompt_len - cached
            self.stats.external_prefix_cache_queries += prompt_len - cached
            self.stats.external_prefix_cache_hits += prompt_len - cached
            self.pool.store(request.blocks, request.hashes, request.prompt_token_ids)
            return True
        request.computed_tokens = cached
        self.stats.prefix_cache_hits += cached
        self.stats.prompt_tokens_by_source["local_cache_hit"] += cached
        self.stats.prompt_tokens_by_source["local_compute"] += prompt_len - cached
        return True

    def _room_for_next_token(self, request: SimRequest) -> bool:
        """Ensure a slot for one more token, preempting others (``_order``) if needed."""
        length = len(request.prompt_token_ids) + request.generated + 1
        while len(request.blocks) * self.pool.block_size < length:
            if self.pool.grow(request.blocks):
                continue
            victim = (
                max(self.running, key=self._order)
                if self.scheduling_policy == "priority"
                else self.running[-1]  # vLLM's fcfs: the last taken into the batch
            )
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: SimRequest) -> None:
        self.running.remove(request)
        self.pool.free(request.blocks)
        request.computed_tokens = 0
        request.kv_pulled = False  # pulled KV is gone with the blocks: recompute
        if self.scheduling_policy == "priority":
            self._wait(request)  # by its own order again
        else:
            self.waiting.appendleft(request)  # vLLM's fcfs: it goes next
        self.stats.preemptions += 1

    def _complete(
        self, prefill_chunks: list[tuple[SimRequest, int]], decoding: list[SimRequest]
    ) -> None:
        self.stats.steps += 1
        emitting = list(decoding)
        for request, chunk in prefill_chunks:
            request.computed_tokens += chunk
            # Like vLLM, every block a chunk fills becomes findable at once, so a request
            # arriving mid-prefill already hits the finished part.
            full_blocks = request.computed_tokens // self.pool.block_size
            self.pool.store(request.blocks, request.hashes[:full_blocks], request.prompt_token_ids)
            if request.prefilled:
                emitting.append(request)  # the step that ends a prefill samples a token
        for request in emitting:
            if request not in self.running:
                continue  # aborted while the step ran
            request.tokens.put_nowait(request.output_token_ids[request.generated])
            request.generated += 1
            self.stats.generation_tokens += 1
            if request.generated >= len(request.output_token_ids):
                self.running.remove(request)
                self._finish(request, "length")

    def _finish(self, request: SimRequest, reason: str) -> None:
        request.finish_reason = reason
        if request.hold_kv and reason != "abort" and request.blocks:
            self.leases[request.request_id] = Lease(
                blocks=request.blocks,
                num_tokens=len(request.prompt_token_ids),
                expires_s=self._clock() + self._lease_s,
                prompt_hashes=tuple(request.hashes),
            )
            request.blocks = []
        else:
            self.pool.free(request.blocks)
        self.stats.finished[reason] += 1
        request.tokens.put_nowait(None)

    def _reap_leases(self) -> None:
        now = self._clock()
        for request_id in [r for r, lease in self.leases.items() if lease.expires_s <= now]:
            self.pool.free(self.leases.pop(request_id).blocks)
        self.publish_events(self.pool.take_events())
