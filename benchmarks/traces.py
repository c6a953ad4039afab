"""Mooncake-format traces as replayable requests, with their prefix structure kept exactly.

A trace line is ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``,
one hash id per ``TRACE_BLOCK_TOKENS`` (512) of prompt, prefix-chained. Each hash id
becomes a fixed block of words; a prompt is its blocks joined, cut to its length.
Every word is one token of the model's tokenizer with a leading space, so a block
of N words is N tokens and blocks never merge across their boundary: identical ids
give identical token runs, and the trace's sharing survives tokenization.

Scaling (shared/traces/README.md): ``length_scale`` divides lengths and the block
size alike; ``speed`` divides the timestamps.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from contracts.block_hashing import BlockHash, block_hashes, none_hash, sha256_pickle
from contracts.tokenization import ModelTokenizer

TRACE_BLOCK_TOKENS = 512
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[2] / "shared/traces/mooncake_conversation_trace.jsonl"
)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    send_at_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def read_trace(
    path: Path, *, speed: float = 1.0, length_scale: float = 1.0, limit: int | None = None,
    max_input_tokens: int | None = None,
) -> list[TraceRequest]:  # fmt: skip
    """The trace's requests, scaled; ``max_input_tokens`` (after scaling) drops longer ones."""
    requests: list[TraceRequest] = []
    with path.open() as lines:
        for line in lines:
            raw = json.loads(line)
            input_tokens = max(1, round(raw["input_length"] / length_scale))
            if max_input_tokens is not None and input_tokens > max_input_tokens:
                continue
            requests.append(TraceRequest(
                send_at_s=raw["timestamp"] / 1000 / speed,
                input_tokens=input_tokens,
                output_tokens=max(1, round(raw["output_length"] / length_scale)),
                hash_ids=tuple(raw["hash_ids"]),
            ))  # fmt: skip
            if limit is not None and len(requests) >= limit:
                break
    return requests


class BlockText:
    """Deterministic text blocks of exactly ``block_tokens`` tokens, one per hash id."""

    def __init__(self, tokenizer: ModelTokenizer, block_tokens: int, seed: int = 0) -> None:
        self.block_tokens = block_tokens
        self._seed = seed
        self._words = one_token_words(tokenizer)
        if len(self._words) < 100:
            raise ValueError("the tokenizer has too few single-token words to build prompts")
        self._cache: dict[int, list[str]] = {}

    def block(self, hash_id: int) -> list[str]:
        words = self._cache.get(hash_id)
        if words is None:
            digest = hashlib.sha256(f"{self._seed}:{hash_id}".encode()).digest()
            rng = random.Random(digest)
            words = self._cache[hash_id] = rng.choices(self._words, k=self.block_tokens)
        return words

    def prompt(self, request: TraceRequest) -> str:
        words: list[str] = []
        for hash_id in request.hash_ids:
            words += self.block(hash_id)
            if len(words) >= request.input_tokens:
                break
        return "".join(words[: request.input_tokens])


def one_token_words(tokenizer: ModelTokenizer) -> list[str]:
    """Words (with their leading space) that the tokenizer encodes as exactly one token."""
    words = []
    for token_id in sorted(tokenizer.tokenizer.get_vocab().values()):
        text = tokenizer.decode_one(token_id)
        plain_word = text.startswith(" ") and text[1:].isalpha() and text.isascii()
        if (
            plain_word
            and len(text) > 2
            and tokenizer.encode(text, add_special_tokens=False) == [token_id]
        ):
            words.append(text)
    return words


def oracle_hit_rate(prompts: Iterable[list[int]], block_size: int) -> float:
    """The infinite-cache prefix hit rate, in tokens: each request reuses every leading
    block an earlier request computed (less the last token, which vLLM recomputes)."""
    seen: set[BlockHash] = set()
    hit = total = 0
    for ids in prompts:
        hashes = block_hashes(ids, block_size, sha256_pickle, none_hash(sha256_pickle))
        leading = next((i for i, h in enumerate(hashes) if h not in seen), len(hashes))
        hit += min(leading * block_size, len(ids) - 1)
        total += len(ids)
        seen.update(hashes)
    return hit / total if total else 0.0
