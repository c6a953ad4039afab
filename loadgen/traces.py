"""Mooncake-format traces as replayable requests, with their prefix structure kept exactly.

A trace line is ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``,
one hash id per ``TRACE_BLOCK_TOKENS`` (512) of prompt, prefix-chained. Each hash id
becomes a fixed block of one-token words (words.py); a prompt is its blocks joined,
cut to its length. Identical ids give identical token runs, so the trace's sharing
survives tokenization exactly.

Scaling (shared/traces/README.md): ``length_scale`` divides lengths and the block
size alike; ``speed`` divides the timestamps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from contracts.block_hashing import BlockHash, block_hashes, none_hash, sha256_pickle
from contracts.tokenization import ModelTokenizer
from loadgen.words import WordSource

TRACE_BLOCK_TOKENS = 512
# The team's shared folder sits beside the checkout; PDSERVE_TRACE overrides.
DEFAULT_TRACE = Path(
    os.environ.get("PDSERVE_TRACE")
    or Path(__file__).resolve().parents[2] / "shared/traces/mooncake_conversation_trace.jsonl"
)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    send_at_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def read_trace(
    path: Path, *, speed: float = 1.0, length_scale: float = 1.0, limit: int | None = None,
    max_input_tokens: int | None = None, on_dropped: Callable[[int], None] | None = None,
) -> list[TraceRequest]:  # fmt: skip
    """The trace's requests, scaled; ``max_input_tokens`` (after scaling) drops longer ones,
    and ``on_dropped`` hears each dropped request's input length, so reports can count them.
    Dropped requests do not count towards ``limit``."""
    requests: list[TraceRequest] = []
    with path.open() as lines:
        for line in lines:
            raw = json.loads(line)
            input_tokens = max(1, round(raw["input_length"] / length_scale))
            if max_input_tokens is not None and input_tokens > max_input_tokens:
                if on_dropped is not None:
                    on_dropped(input_tokens)
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
        self._words = WordSource(tokenizer)
        self._cache: dict[int, list[str]] = {}

    def block(self, hash_id: int) -> list[str]:
        words = self._cache.get(hash_id)
        if words is None:
            words = self._cache[hash_id] = self._words.words(
                f"trace:{self._seed}:{hash_id}", self.block_tokens
            )
        return words

    def prompt(self, request: TraceRequest) -> str:
        words: list[str] = []
        for hash_id in request.hash_ids:
            words += self.block(hash_id)
            if len(words) >= request.input_tokens:
                break
        return "".join(words[: request.input_tokens])


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
