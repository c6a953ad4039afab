"""Prefix-cache block hashes, computed exactly the way vLLM computes them.

A prompt's token ids are cut into full blocks of ``block_size`` tokens; block i's
hash is ``hash_fn((parent_hash, tuple(block_tokens), extra_keys))`` with the
parent of block 0 being ``NONE_HASH = hash_fn(seed)``. Chaining makes a block's
hash name its whole prefix, so two prompts share block i's hash exactly when they
share the first (i+1)*block_size tokens. A trailing partial block has no hash.

vLLM's KV events carry each hash as its low 64 bits, big-endian
(``external_block_hash``). Pure functions: the seed and the algorithm are
parameters, never globals, so the router, the simulator and the tests agree by
construction.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any, NewType

BlockHash = NewType("BlockHash", bytes)
HashFn = Callable[[Any], bytes]

# vLLM's seed for NONE_HASH when PYTHONHASHSEED is unset (v1/core/kv_cache_utils.py).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_LOW_64_BITS = (1 << 64) - 1


def sha256_pickle(value: Any) -> bytes:
    """vLLM's ``sha256`` (the default ``--prefix-caching-hash-algo``)."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256_pickle}


def hash_function(name: str) -> HashFn:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown prefix-caching hash algorithm {name!r}; known: {sorted(HASH_FUNCTIONS)}"
        ) from None


def none_hash(hash_fn: HashFn, seed: str = DEFAULT_NONE_HASH_SEED) -> BlockHash:
    """The parent hash of every first block."""
    return BlockHash(hash_fn(seed))


def hash_block(
    hash_fn: HashFn,
    parent: BlockHash,
    block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    return BlockHash(hash_fn((parent, tuple(block_token_ids), extra_keys)))


def block_hashes(
    token_ids: Sequence[int], block_size: int, hash_fn: HashFn, root: BlockHash
) -> list[BlockHash]:
    """The chained hashes of every full block of ``token_ids``."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    hashes: list[BlockHash] = []
    parent = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(hash_fn, parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


def external_block_hash(block_hash: BlockHash) -> int:
    """The integer form KV events carry: the hash's low 64 bits, read big-endian."""
    return int.from_bytes(block_hash, byteorder="big") & _LOW_64_BITS
