"""A long prompt's head, tokenized alone, hashes to the same leading blocks as the whole
prompt, and estimates the rest on the low side (the real tiny-llama tokenizer)."""

from __future__ import annotations

import asyncio
import random

import pytest

from contracts.workers import WorkerRegistration, WorkerRole
from modelstore import tiny_llama
from router.fleet.registry import WorkerState
from router.prepare.prepare import (
    Endpoint,
    PreparedRequest,
    Tokenized,
    measure_head,
    measure_prompt,
)
from router.prepare.prompt_blocks import BlockHashers
from router.prepare.token_prefix_cache import TokenPrefixCache


def prefill_worker() -> WorkerState:
    registration = WorkerRegistration(
        worker_id="p", role=WorkerRole.PREFILL, model="m", engine_url="http://e",
        block_size=16, tokenizer_path=str(tiny_llama.ensure()), max_model_len=1_000_000,
    )  # fmt: skip
    return WorkerState(registration, 0.0)


def request(body: dict, *, chat: bool) -> PreparedRequest:
    return PreparedRequest(
        endpoint=Endpoint.CHAT if chat else Endpoint.COMPLETIONS, body=body, model="m",
        stream=False, arrived_s=0.0, requested_model="m",
    )  # fmt: skip


def text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = ["the", "router", "prefill", "decode", "cache,", "tokens.", "Mooncake", "42"]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


@pytest.mark.parametrize("cached", [False, True], ids=["tokenized", "token prefix cache"])
def test_the_heads_blocks_are_the_whole_prompts_leading_blocks_and_the_rest_is_not_overrated(
    cached,
):
    worker, hashers = prefill_worker(), BlockHashers(memo_entries=10_000)
    cache = TokenPrefixCache(max_tokens=100_000, stride_chars=256) if cached else None
    for chat in (False, True):
        prompt = text(3000, seed=7)
        body = ({"messages": [{"role": "user", "content": prompt}]} if chat
                else {"prompt": prompt})  # fmt: skip
        head = measure_head(request(body, chat=chat), [worker], hashers, head_chars=2048,
                            token_cache=cache)  # fmt: skip
        tokenized: list[Tokenized] = []
        whole = asyncio.run(measure_prompt(request(body, chat=chat), [worker], hashers,
                                           offload_chars=10**9, token_cache=cache,
                                           on_tokenized=tokenized.append))  # fmt: skip
        if cached:  # the whole prompt's tokenizing started from the head's
            assert 2048 - 2 * 256 <= tokenized[0].reused_chars <= 2048
        assert head is not None
        head_hashes = head.blocks.all()
        assert len(head_hashes) >= 16  # ~2k characters of it, whole blocks only
        assert whole.all()[: len(head_hashes)] == head_hashes
        rest = whole.token_count - head.blocks.token_count
        assert 0.6 * rest <= head.rest_tokens(0.8) <= rest
        assert head.rest_tokens(0.5) < head.rest_tokens(0.8)


def test_short_prompts_and_token_ids_are_not_measured_in_part():
    worker, hashers = prefill_worker(), BlockHashers(memo_entries=100)
    short = request({"prompt": text(100, seed=1)}, chat=False)
    ids = request({"prompt": list(range(5000))}, chat=False)
    assert measure_head(short, [worker], hashers, head_chars=2048) is None
    assert measure_head(ids, [worker], hashers, head_chars=2048) is None
