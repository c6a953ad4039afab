"""The prepare stage: from a client's body to a typed request the pipeline can route.

Two steps, because a request for several choices is split between them (fan_out.py):
- ``prepare``: validate the fields the router reads, resolve an alias to the served
  model, 404 an unknown model. Once per request.
- ``measure_prompt``: tokenize as vLLM does (the pool's tokenizer and chat template),
  apply the context-length guard, and cut the ids into hashed blocks. Once per choice,
  with the pool that will serve it.

Before it, a long prompt headed for a busy pool may be measured in part
(``measure_head``): its first few thousand characters, tokenized and hashed, tell how
far each worker's cached prefix can reach into it, so admission can refuse one that
would be late without tokenizing it all.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contracts.tokenization import ModelTokenizer, PromptError, load_tokenizer
from contracts.workers import WorkerRegistration
from router.admission.tenants import ANONYMOUS, PRIORITIES, Tenant, TenantPolicy
from router.errors import Forbidden, InvalidRequest, NotFound
from router.fleet.registry import WorkerState
from router.prepare.context_window import check_prompt_chars, check_prompt_tokens, context_limit
from router.prepare.prompt_blocks import BlockHashers, PromptBlocks
from router.prepare.schemas import (
    ChatCompletionRequest,
    ClientRequest,
    CompletionRequest,
    EmbeddingRequest,
    validate,
)
from router.prepare.token_prefix_cache import TokenPrefixCache


class Endpoint(enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"
    EMBEDDINGS = "embeddings"

    @property
    def path(self) -> str:
        return _PATHS[self]

    @property
    def schema(self) -> type[ClientRequest]:
        return _SCHEMAS[self]

    @property
    def prompt_param(self) -> str:
        return _PROMPT_PARAMS[self]


_PATHS = {Endpoint.COMPLETIONS: "/v1/completions", Endpoint.CHAT: "/v1/chat/completions",
          Endpoint.EMBEDDINGS: "/v1/embeddings"}  # fmt: skip
_SCHEMAS: dict[Endpoint, type[ClientRequest]] = {Endpoint.COMPLETIONS: CompletionRequest,
    Endpoint.CHAT: ChatCompletionRequest, Endpoint.EMBEDDINGS: EmbeddingRequest}  # fmt: skip
_PROMPT_PARAMS = {Endpoint.COMPLETIONS: "prompt", Endpoint.CHAT: "messages",
                  Endpoint.EMBEDDINGS: "input"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One validated client request (or one choice of it), ready to admit and route."""

    endpoint: Endpoint
    body: dict[str, Any]  # what the engines get: the client's fields, the served model name
    model: str  # the served model
    stream: bool
    arrived_s: float
    # The name the client asked for: the model, or an alias with a routing policy of its own.
    requested_model: str
    tenant: Tenant = field(default_factory=lambda: Tenant(ANONYMOUS, TenantPolicy()))
    priority: int = 1  # index into tenants.PRIORITIES: 0 is the highest class
    ttft_slo_s: float | None = None  # what the client asked for (admission caps it)
    # Set by admission: the output the decode side's KV must hold (max_tokens, or the rest
    # of the context), its predicted TTFT, and when its prefill must end for its first
    # token to meet the TTFT target (the target less the predicted KV handoff).
    max_output_tokens: int = 0
    predicted_ttft_s: float | None = None
    prefill_deadline_s: float | None = None
    # False for a fan-out's later samples of one prompt: usage counts that prompt once.
    counts_prompt: bool = True
    # A batch line's: it runs only on room interactive traffic leaves (admission refuses
    # it with 429 ``batch_yields`` otherwise), unless its batch is at risk of expiring.
    yields: bool = False
    # Set by the model's route (``rollout.py``): the stage that serves it (prod, canary, or
    # shadow for a mirrored copy) and that stage's version (None: no route, any version; a
    # set: no route, and the model's policy lets its approved versions serve only).
    stage: str = "prod"
    version: str | frozenset[str] | None = None

    @property
    def tenant_class(self) -> str:
        return PRIORITIES[self.priority]

    @property
    def path(self) -> str:
        return self.endpoint.path

    @property
    def chat(self) -> bool:
        return self.endpoint is Endpoint.CHAT

    @property
    def routing_key(self) -> str:
        return self.requested_model


def prepare(
    endpoint: Endpoint,
    body: Any,
    *,
    max_tokens_cap: int,
    aliases: Mapping[str, str],
    served_models: Collection[str],
    arrived_s: float,
    tenant: Tenant | None = None,
    priority_header: str | None = None,
    ttft_slo_header: str | None = None,
) -> PreparedRequest:
    parsed = validate(endpoint.schema, body, max_tokens_cap=max_tokens_cap)
    served = aliases.get(parsed.model, parsed.model)
    if served != parsed.model:
        body = {**body, "model": served}  # engines know the served name only
    if "priority" in body:  # vLLM's: the router sets it from the request's class, not the client
        body = {key: value for key, value in body.items() if key != "priority"}
    if served not in served_models:
        raise NotFound(
            f"model {parsed.model!r} is not served here; see GET /v1/models",
            param="model",
            code="model_not_found",
        )
    tenant = tenant or Tenant(ANONYMOUS, TenantPolicy())
    if not tenant.may_use(parsed.model, served):
        raise Forbidden(
            f"model {parsed.model!r} is not among this API key's allowed models",
            param="model", code="model_not_allowed",
        )  # fmt: skip
    return PreparedRequest(
        endpoint=endpoint, body=body, model=served, stream=getattr(parsed, "stream", False),
        arrived_s=arrived_s,
        requested_model=parsed.model, tenant=tenant,
        priority=tenant.priority_for(priority_header), ttft_slo_s=_slo_s(ttft_slo_header),
    )  # fmt: skip


def _slo_s(header: str | None) -> float | None:
    """``x-pdserve-ttft-slo-ms`` in seconds; a value that is not a positive number is a 400."""
    if header is None:
        return None
    try:
        milliseconds = float(header)
    except ValueError:
        milliseconds = -1.0
    if not 0 < milliseconds < 1e9:
        raise InvalidRequest(
            f"x-pdserve-ttft-slo-ms must be a positive number of milliseconds, got {header!r}",
            param="x-pdserve-ttft-slo-ms", code="invalid_header",
        )  # fmt: skip
    return milliseconds / 1000.0


@dataclass(frozen=True, slots=True)
class PromptHead:
    """A long prompt's first characters, tokenized and cut into whole hashed blocks."""

    blocks: PromptBlocks
    tokens: int  # the head's text encoded, the blocks and the few tokens past them
    chars: int
    rest_chars: int  # of the prompt's text after the head

    def rest_tokens(self, share: float) -> int:
        """The tokens after the head's blocks, estimated on the low side: the rest is
        assumed to have ``share`` of the head's tokens per character (a true bound would
        need the longest token, several times too low; ``rest_density.py`` learns it)."""
        rest = self.rest_chars * self.tokens / self.chars * share
        return self.tokens - self.blocks.token_count + int(rest)


# The last tokens before a cut may merge with the text after it; not counted as the head's.
_CUT_MARGIN_TOKENS = 2


def measure_head(
    request: PreparedRequest, workers: Sequence[WorkerState], hashers: BlockHashers, *,
    head_chars: int, token_cache: TokenPrefixCache | None = None,
) -> PromptHead | None:  # fmt: skip
    """The head of a prompt of over twice ``head_chars`` characters; None for a shorter
    one, token ids, or a prompt ``measure_prompt`` will refuse. Through ``token_cache``,
    the whole prompt's tokenizing that follows starts from the head."""
    registration = _tokenizing_registration(workers)
    if registration is None or head_chars <= 0:
        return None
    if prompt_chars(request) <= 2 * head_chars:
        return None
    tokenizer = load_tokenizer(str(registration.tokenizer_path))
    try:
        spec = tokenizer.request_text(request.body, chat=request.chat)
    except (PromptError, TypeError, AttributeError):
        return None
    cut = -1 if spec is None else spec[0].rfind(" ", 0, head_chars)
    if spec is None or cut <= 0:
        return None
    text, specials = spec
    if token_cache is None:
        ids = tokenizer.encode(text[:cut], add_special_tokens=specials)
    else:
        ids, _ = token_cache.encode(tokenizer, text[:cut], add_special_tokens=specials)
    block_size = int(registration.block_size or 1)
    whole = (len(ids) - _CUT_MARGIN_TOKENS) // block_size * block_size
    if whole <= 0:
        return None
    blocks = _hashed(hashers, registration, ids[:whole])
    return PromptHead(blocks, tokens=len(ids), chars=cut, rest_chars=len(text) - cut)


async def measure_prompt(
    request: PreparedRequest,
    workers: Sequence[WorkerState],
    hashers: BlockHashers,
    *,
    offload_chars: int,
    token_cache: TokenPrefixCache | None = None,
    on_tokenized: Callable[[Tokenized], None] = lambda tokenized: None,
) -> PromptBlocks:
    """The prompt's hashed blocks, with the pool's tokenizer, block size and hash;
    ``token_cache`` spares re-tokenizing a prefix seen lately. ``on_tokenized`` gets what
    the tokenizing cost."""
    registration = _tokenizing_registration(workers)
    if registration is None:
        return PromptBlocks.unknown()
    tokenizer = load_tokenizer(str(registration.tokenizer_path))
    limit = context_limit(workers)
    param = request.endpoint.prompt_param
    chars = prompt_chars(request)
    if limit:
        check_prompt_chars(chars, limit, tokenizer.max_chars_per_token, param)
    try:
        if chars > offload_chars:
            # Long prompts tokenize in a thread (the Rust tokenizer drops the GIL),
            # so one huge prompt does not stall every stream on the event loop.
            ids, tokenized = await asyncio.to_thread(_token_ids, tokenizer, request, token_cache)
        else:
            ids, tokenized = _token_ids(tokenizer, request, token_cache)
    except (PromptError, TypeError, AttributeError) as error:
        raise InvalidRequest(f"cannot tokenize the prompt: {error}") from None
    on_tokenized(tokenized)
    if limit:
        check_prompt_tokens(len(ids), limit, param)
    return _hashed(hashers, registration, ids)


def _tokenizing_registration(workers: Sequence[WorkerState]) -> WorkerRegistration | None:
    """The pool's tokenizer and block hashing, from a worker that reports both."""
    registration = next((w.registration for w in workers if w.registration.block_size), None)
    return None if registration is None or registration.tokenizer_path is None else registration


def _hashed(
    hashers: BlockHashers, registration: WorkerRegistration, ids: list[int]
) -> PromptBlocks:
    assert registration.block_size is not None
    return hashers.blocks(
        ids, block_size=registration.block_size,
        algorithm=registration.prefix_caching_hash_algo, seed=registration.prefix_hash_seed,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Tokenized:
    cpu_s: float  # the tokenizing thread's own CPU time (chat template included)
    chars: int  # of the text encoded (0 for token ids)
    reused_chars: int  # of them, a cached prefix's: not tokenized again


def _token_ids(
    tokenizer: ModelTokenizer, request: PreparedRequest, cache: TokenPrefixCache | None
) -> tuple[list[int], Tokenized]:
    started_s = time.thread_time()
    spec = tokenizer.request_text(request.body, chat=request.chat)
    if spec is None:
        ids, chars, reused = tokenizer.completion_ids(request.body.get("prompt")), 0, 0
    elif cache is None:
        ids, chars, reused = tokenizer.encode(spec[0], add_special_tokens=spec[1]), len(spec[0]), 0
    else:
        ids, reused = cache.encode(tokenizer, spec[0], add_special_tokens=spec[1])
        chars = len(spec[0])
    return ids, Tokenized(time.thread_time() - started_s, chars, reused)


def tokens_at_most(request: PreparedRequest) -> int:
    """A generous bound on the prompt's tokens before tokenizing: a character is at most
    four UTF-8 bytes, a byte-level token at least one, plus a chat template's own."""
    return 4 * prompt_chars(request) + 512


def prompt_chars(request: PreparedRequest) -> int:
    """The prompt's length in characters, for the guard that runs before tokenizing.

    Read from the endpoint's own field: a chat field on /v1/completions is ignored."""
    if request.chat:
        messages = request.body.get("messages") or ()
        return sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
    prompt = request.body.get("prompt")
    return len(prompt) if isinstance(prompt, str | list) else 0
