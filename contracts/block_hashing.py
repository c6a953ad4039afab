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
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NewType

import cbor2

BlockHash = NewType("BlockHash", bytes)
HashFn = Callable[[Any], bytes]

# vLLM's seed for NONE_HASH when PYTHONHASHSEED is unset (v1/core/kv_cache_utils.py).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_LOW_64_BITS = (1 << 64) - 1
_PACKED_TOKEN_BYTES = array("q").itemsize


def sha256_pickle(value: Any) -> bytes:
    """vLLM's ``sha256`` (the default ``--prefix-caching-hash-algo``)."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(value: Any) -> bytes:
    """vLLM's ``sha256_cbor``: language-neutral serialization (canonical CBOR)."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


# The names are vLLM's --prefix-caching-hash-algo values. vLLM's xxhash and
# xxhash_cbor are left out on purpose: vLLM seeds them with random bytes per process
# unless PYTHONHASHSEED is set, so a router cannot compute their hashes.
HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256_pickle, "sha256_cbor": sha256_cbor}


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


class MemoizedBlockHasher:
    """``block_hashes`` with an LRU memo of (parent, block tokens) -> hash.

    Prompts that share a prefix (a system prompt, earlier chat turns) repeat the same
    blocks; looking a block up costs a fraction of serializing and hashing it. The
    memo key is the block's token ids packed as bytes (one C-level copy of the prompt,
    then a slice per block): a tuple of ints per block cost more than the hash it saved.
    The memo holds at most ``max_entries`` blocks.
    """

    def __init__(self, hash_fn: HashFn, root: BlockHash, max_entries: int = 65536) -> None:
        self._hash_fn = hash_fn
        self._root = root
        self._max_entries = max_entries
        self._memo: OrderedDict[tuple[bytes, bytes], BlockHash] = OrderedDict()

    def __repr__(self) -> str:
        return f"MemoizedBlockHasher(entries={len(self._memo)})"

    def __call__(self, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
        return list(self.lazy(token_ids, block_size))

    def lazy(self, token_ids: Sequence[int], block_size: int) -> Iterator[BlockHash]:
        """The chain one block at a time, so a caller can stop where nothing matches."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        full = len(token_ids) // block_size * block_size
        packed = array("q", token_ids[:full]).tobytes()
        width = block_size * _PACKED_TOKEN_BYTES
        parent = self._root
        memo = self._memo
        for start in range(0, full, block_size):
            offset = start * _PACKED_TOKEN_BYTES
            key = (parent, packed[offset : offset + width])
            known = memo.get(key)
            if known is None:
                known = memo[key] = hash_block(
                    self._hash_fn, parent, token_ids[start : start + block_size]
                )
                if len(memo) > self._max_entries:
                    memo.popitem(last=False)
            else:
                memo.move_to_end(key)
            yield known
            parent = known
