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
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NewType

import cbor2

BlockHash = NewType("BlockHash", bytes)
HashFn = Callable[[Any], bytes]
HashedBlock = tuple[BlockHash, int]  # a hash and its external (KV event) form

# vLLM's seed for NONE_HASH when PYTHONHASHSEED is unset (v1/core/kv_cache_utils.py).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_LOW_64_BITS = (1 << 64) - 1


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


def none_hash(hash_fn: HashFn, seed: str | None = None) -> BlockHash:
    """The parent hash of every first block; ``seed`` None is vLLM's default."""
    return BlockHash(hash_fn(DEFAULT_NONE_HASH_SEED if seed is None else seed))


def engine_hash_seed(engine_env: Mapping[str, str]) -> str | None:
    """The NONE_HASH seed an engine started with this environment uses, None for the default.

    vLLM takes PYTHONHASHSEED as the seed whenever it is set, for every algorithm; an
    operator who sets it (for reproducibility, say) changes every block hash, and a
    router that assumed the default would silently find no prefix anywhere.
    """
    return engine_env.get("PYTHONHASHSEED")


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
    """``block_hashes`` with a bounded memo, looked up a line of blocks at a time.

    Prompts that share a prefix (a system prompt, earlier chat turns) repeat the same
    blocks, and looking them up costs a fraction of serializing and hashing them. The
    memo maps (parent hash, the tokens of up to ``LINE_BLOCKS`` blocks) to those
    blocks' (hash, external hash) pairs: at block size 16 a per-block memo spent more
    on building one key per block than the lookup saved. A line that misses is hashed
    block by block as the caller reads it, so a caller that stops early (nothing
    matches further) pays for what it read. The memo holds about ``max_entries``
    blocks and forgets the oldest line first: a hot line that falls out costs one
    rehash, less than refreshing every line's place on every hit would.
    """

    LINE_BLOCKS = 8

    def __init__(self, hash_fn: HashFn, root: BlockHash, max_entries: int = 65536) -> None:
        self._hash_fn = hash_fn
        self._root = root
        self._max_lines = max(1, max_entries // self.LINE_BLOCKS)
        self._memo: OrderedDict[tuple[bytes, tuple[int, ...]], tuple[HashedBlock, ...]] = (
            OrderedDict()
        )

    def __repr__(self) -> str:
        return f"MemoizedBlockHasher(lines={len(self._memo)})"

    def __call__(self, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
        return [block_hash for block_hash, _ in self.lazy(token_ids, block_size)]

    def lazy(self, token_ids: Sequence[int], block_size: int) -> Iterator[HashedBlock]:
        """(hash, external hash) one block at a time: a caller can stop where nothing matches."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        parent = self._root
        memo = self._memo
        full = len(token_ids) // block_size * block_size
        span = block_size * self.LINE_BLOCKS
        for start in range(0, full, span):
            end = min(start + span, full)
            key = (parent, tuple(token_ids[start:end]))
            line = memo.get(key)
            if line is None:
                hashed: list[HashedBlock] = []
                for block_start in range(start, end, block_size):
                    block = key[1][block_start - start : block_start - start + block_size]
                    parent = hash_block(self._hash_fn, parent, block)
                    hashed.append((parent, external_block_hash(parent)))
                    yield hashed[-1]
                line = memo[key] = tuple(hashed)
                if len(memo) > self._max_lines:
                    memo.popitem(last=False)
            else:
                yield from line
            parent = line[-1][0]
