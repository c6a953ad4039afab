"""Cache-aware worker selection: the prompt's blocks, the prefix index, load, a policy.

For each request the orchestrator asks:
1. ``prompt_blocks``: the prompt's token ids (the model's own tokenizer and chat
   template, as vLLM tokenizes) cut into blocks and hashed as vLLM hashes them;
2. ``pick``: a worker from a pool, by the model's policy (routing.py);
3. ``record`` + ``track``: what was sent where (the index's routing-time records)
   and what is in flight (the load the scorers read).
Worker lifecycle (``on_registered``, ``on_gone``) keeps the index and the KV event
feed in step with the registry: a new incarnation starts with an empty index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence

from contracts.block_hashing import (
    HashedBlock,
    MemoizedBlockHasher,
    hash_function,
    none_hash,
)
from contracts.tokenization import ModelTokenizer, PromptError, load_tokenizer
from contracts.workers import WorkerRegistration, WorkerRole
from router.context_window import (
    check_prompt_chars,
    check_prompt_tokens,
    context_limit,
)
from router.errors import InvalidRequest
from router.kv_event_feed import KVEventFeed
from router.prefix_index import PrefixIndex
from router.registry import WorkerState
from router.routing import Decision, InFlight, Pipeline, RouteQuery, parse_weights
from router.settings import RouterSettings

log = logging.getLogger("pdserve.router")


class PromptBlocks:
    """A prompt's block hashes (vLLM's external 64-bit form), computed as far as asked.

    Routing needs only as many leading blocks as some worker holds, plus one: a cold
    4k-token prompt at block size 16 is routed after hashing one block, not 256.
    Blocks a worker held were hashed before and come from the hasher's memo. The rest
    are hashed when the chosen worker's routing-time record needs them.
    """

    __slots__ = ("_chain", "_hashes", "block_size", "token_count")

    def __init__(
        self, token_count: int, block_size: int, chain: Iterator[HashedBlock] | None = None
    ) -> None:
        self.token_count = token_count
        self.block_size = block_size
        self._chain = chain
        self._hashes: list[int] = []

    def __repr__(self) -> str:
        return f"PromptBlocks(tokens={self.token_count}, hashed={len(self._hashes)})"

    @classmethod
    def unknown(cls, token_count: int = 0) -> PromptBlocks:
        """No tokenizer or block size known for the model: nothing to match."""
        return cls(token_count=token_count, block_size=1)

    @property
    def known(self) -> bool:
        """Whether the prompt has full blocks the index could hold."""
        return self._chain is not None and self.token_count >= self.block_size

    def leading(self) -> Iterator[int]:
        """The hashes from the first block on, hashing only as far as the caller reads.

        One reader at a time (routing is synchronous): what an earlier reader hashed
        is replayed, then the chain goes on where it stopped."""
        yield from self._hashes
        if self._chain is None:
            return
        for _, external in self._chain:
            self._hashes.append(external)
            yield external

    def all(self) -> list[int]:
        for _ in self.leading():
            pass
        return self._hashes


class WorkerSelector:
    def __init__(self, settings: RouterSettings, *, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self.index = PrefixIndex(max_blocks=settings.prefix_index_max_blocks)
        self.feed = KVEventFeed(
            self.index, fallback_s=settings.kv_events_fallback_s, clock=clock,
            on_event=self._count_event,
        )  # fmt: skip
        self._inflight: dict[str, InFlight] = {}
        self._pipelines: dict[tuple[str, WorkerRole], Pipeline] = {}
        self._recent: dict[str, deque[str]] = {}  # pool -> last chosen worker ids
        self._capacity_blocks: dict[str, int | None] = {}
        self._hashers: dict[tuple[str, str | None], MemoizedBlockHasher] = {}
        self._policies = settings.routing_policies()  # parsed once, not per request
        self.event_counts: Counter[tuple[str, str]] = Counter()
        self.predicted_hit_tokens: Counter[str] = Counter()
        self.routed_prompt_tokens: Counter[str] = Counter()
        self.routed_requests: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"WorkerSelector(index={self.index!r})"

    # -- worker lifecycle -------------------------------------------------------

    def on_registered(self, registration: WorkerRegistration, new_incarnation: bool) -> None:
        worker_id = registration.worker_id
        if registration.block_size and registration.kv_capacity_tokens:
            self._capacity_blocks[worker_id] = (
                registration.kv_capacity_tokens // registration.block_size
            )
        if new_incarnation:
            self.index.clear_worker(worker_id)
        if registration.kv_events_endpoint and self._settings.prefix_index_source != "approximate":
            self.feed.watch(worker_id, registration.kv_events_endpoint, registration.incarnation)

    def on_gone(self, worker_id: str) -> None:
        self.feed.unwatch(worker_id)
        self.index.clear_worker(worker_id)
        self._capacity_blocks.pop(worker_id, None)
        self._inflight.pop(worker_id, None)
        for counter in (self.predicted_hit_tokens, self.routed_prompt_tokens,
                        self.routed_requests):  # fmt: skip
            counter.pop(worker_id, None)
        for key in [k for k in self.event_counts if k[0] == worker_id]:
            del self.event_counts[key]

    # -- per request ------------------------------------------------------------

    async def prompt_blocks(
        self, body: dict, *, chat: bool, workers: Sequence[WorkerState]
    ) -> PromptBlocks:
        """The prompt's hashed blocks, with the pool's tokenizer, block size and hash."""
        registration = next((w.registration for w in workers if w.registration.block_size), None)
        if registration is None or registration.tokenizer_path is None:
            return PromptBlocks.unknown()
        tokenizer = load_tokenizer(registration.tokenizer_path)
        limit = context_limit(workers)
        param = "messages" if chat else "prompt"
        chars = _prompt_chars(body)
        if limit:
            check_prompt_chars(chars, limit, tokenizer.max_chars_per_token, param)
        try:
            if chars > self._settings.tokenize_offload_chars:
                # Long prompts tokenize in a thread (the Rust tokenizer drops the GIL),
                # so one huge prompt does not stall every stream on the event loop.
                ids = await asyncio.to_thread(_token_ids, tokenizer, body, chat)
            else:
                ids = _token_ids(tokenizer, body, chat)
        except (PromptError, TypeError, AttributeError) as error:
            raise InvalidRequest(f"cannot tokenize the prompt: {error}") from None
        if limit:
            check_prompt_tokens(len(ids), limit, param)
        assert registration.block_size is not None
        hasher = self._hasher(registration.prefix_caching_hash_algo, registration.prefix_hash_seed)
        return PromptBlocks(
            len(ids), registration.block_size, hasher.lazy(ids, registration.block_size)
        )

    def _hasher(self, algorithm: str, seed: str | None) -> MemoizedBlockHasher:
        hasher = self._hashers.get((algorithm, seed))
        if hasher is None:
            hash_fn = hash_function(algorithm)
            hasher = self._hashers[(algorithm, seed)] = MemoizedBlockHasher(
                hash_fn, none_hash(hash_fn, seed), self._settings.block_hash_memo_entries
            )
        return hasher

    def pick(
        self,
        model: str,
        role: WorkerRole,
        workers: Sequence[WorkerState],
        blocks: PromptBlocks,
        exclude: Sequence[str] = (),
    ) -> Decision | None:
        now = self._clock()
        query = RouteQuery(
            prompt_tokens=max(1, blocks.token_count),
            block_size=blocks.block_size,
            matched=self.index.match(blocks.leading(), now) if blocks.known else {},
        )
        decision = self._pipeline(model, role).pick(
            f"{model}/{role.value}", workers, query, self.inflight, exclude
        )
        if decision is not None:
            recent = self._recent.setdefault(
                role.value, deque(maxlen=self._settings.hotspot_window_requests)
            )
            recent.append(decision.worker.worker_id)
        return decision

    def record(self, worker_id: str, blocks: PromptBlocks, decision: Decision | None) -> None:
        """The worker is about to compute or receive these blocks."""
        self.routed_requests[worker_id] += 1
        if decision is not None:
            self.routed_prompt_tokens[worker_id] += blocks.token_count
            self.predicted_hit_tokens[worker_id] += blocks.token_count - decision.uncached_tokens
        if not blocks.known:
            return
        live = self.feed.is_live(worker_id) and self._settings.prefix_index_source != "approximate"
        ttl_s = (
            self._settings.prefix_speculative_ttl_s
            if live
            else self._settings.prefix_approximate_ttl_s
        )
        self.index.record(
            worker_id, blocks.all(), expires_s=self._clock() + ttl_s,
            capacity_blocks=self._capacity_blocks.get(worker_id),
        )  # fmt: skip

    def inflight(self, worker_id: str) -> InFlight:
        return self._inflight.setdefault(worker_id, InFlight())

    @contextlib.contextmanager
    def track(self, worker_id: str, tokens: int) -> Iterator[None]:
        """Count a request in flight on a worker for the duration of the block."""
        end = self.begin(worker_id, tokens)
        try:
            yield
        finally:
            end()

    def begin(self, worker_id: str, tokens: int) -> Callable[[], None]:
        """``track`` for work that ends in a callback (a relayed stream): returns the end."""
        load = self.inflight(worker_id)
        load.requests += 1
        load.tokens += tokens
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                load.requests -= 1
                load.tokens -= tokens

        return end

    def hotspot_factor(self, role: WorkerRole, workers: int) -> float | None:
        """Workers x the largest share of the recent decisions; 1.0 is perfectly even."""
        recent = self._recent.get(role.value)
        if not recent or workers < 1:
            return None
        return workers * max(Counter(recent).values()) / len(recent)

    def policy_of(self, model: str) -> str:
        return self._policies.get(model, self._settings.routing_policy)

    def expire(self) -> int:
        return self.index.expire(self._clock())

    def _pipeline(self, model: str, role: WorkerRole) -> Pipeline:
        key = (model, role)
        pipeline = self._pipelines.get(key)
        if pipeline is None:
            scorers = (
                self._settings.decode_scorers
                if role is WorkerRole.DECODE
                else self._settings.prefill_scorers
            )
            pipeline = self._pipelines[key] = Pipeline(
                policy=self.policy_of(model),
                weights=parse_weights(scorers),
                epsilon=self._settings.bounded_load_epsilon,
                load_floor=self._settings.bounded_load_floor,
                token_floor=self._settings.bounded_load_token_floor,
            )
        return pipeline

    def _count_event(self, worker_id: str, kind: str) -> None:
        self.event_counts[(worker_id, kind)] += 1


def _token_ids(tokenizer: ModelTokenizer, body: dict, chat: bool) -> list[int]:
    return tokenizer.request_ids(body, chat=chat)


def _prompt_chars(body: dict) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", ""))) for m in body["messages"] or ())
    prompt = body.get("prompt")
    return len(prompt) if isinstance(prompt, str | list) else 0
