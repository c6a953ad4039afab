"""The simulator's paged KV cache: fixed blocks, prefix caching, LRU eviction, events.

Invariants:
- a block is *in use* while ``ref_count > 0``; in-use blocks are never evicted;
- a freed block that holds a full, hashed prompt block stays findable by its hash
  (a prefix-cache hit revives it) until it is evicted, least recently freed first;
- every block that becomes findable emits ``PoolBlocksStored`` and every findable block
  that is evicted emits ``PoolBlocksEvicted``, in order, into ``events`` for a publisher
  to drain with ``take_events()``; this module does no I/O. They carry the pool's own
  hashes; ``sim/kv_events.py`` turns them into the wire types of ``contracts.kv_events``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from contracts.block_hashing import BlockHash


@dataclass(frozen=True, slots=True)
class PoolBlocksStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class PoolBlocksEvicted:
    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class PoolCleared:
    pass


PoolEvent = PoolBlocksStored | PoolBlocksEvicted | PoolCleared


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None


@dataclass(slots=True)
class KVBlockPool:
    num_blocks: int
    block_size: int
    _blocks: list[Block] = field(init=False)
    # Blocks with ref_count 0, oldest-freed first; hashed ones are still findable.
    _free: OrderedDict[int, Block] = field(init=False)
    _by_hash: dict[BlockHash, Block] = field(init=False)
    events: list[PoolEvent] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("a KV pool needs at least one block of at least one token")
        self._blocks = [Block(i) for i in range(self.num_blocks)]
        self._free = OrderedDict((b.block_id, b) for b in self._blocks)
        self._by_hash = {}

    def __repr__(self) -> str:
        return f"KVBlockPool(blocks={self.num_blocks}, free={len(self._free)})"

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's kv_cache_usage_perc, as a fraction)."""
        return 1 - len(self._free) / self.num_blocks

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def cached_prefix_blocks(self, hashes: list[BlockHash]) -> int:
        """How many leading blocks of a prompt are already held."""
        count = 0
        for block_hash in hashes:
            if block_hash not in self._by_hash:
                break
            count += 1
        return count

    def allocate(self, hashes: list[BlockHash], blocks_needed: int) -> list[Block] | None:
        """Blocks for a sequence: its cached prefix revived, the rest fresh.

        Returns None, changing nothing, when the pool cannot supply them.
        """
        cached = [self._by_hash[h] for h in hashes[: self.cached_prefix_blocks(hashes)]]
        revived_from_free = sum(1 for b in cached if b.ref_count == 0)
        fresh_needed = max(0, blocks_needed - len(cached))
        if len(self._free) - revived_from_free < fresh_needed:
            return None
        for block in cached:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1
        return cached + [self._take_free() for _ in range(fresh_needed)]

    def grow(self, blocks: list[Block]) -> bool:
        """Append one fresh block to a running sequence; False if none is free."""
        if not self._free:
            return False
        blocks.append(self._take_free())
        return True

    def store(self, blocks: list[Block], hashes: list[BlockHash], token_ids: list[int]) -> None:
        """Make a sequence's computed full blocks findable by their hashes."""
        new = [(b, h) for b, h in zip(blocks, hashes, strict=False) if b.block_hash is None]
        new = [(b, h) for b, h in new if h not in self._by_hash]
        if not new:
            return
        for block, block_hash in new:
            block.block_hash = block_hash
            self._by_hash[block_hash] = block
        first = hashes.index(new[0][1])
        self.events.append(
            PoolBlocksStored(
                block_hashes=tuple(h for _, h in new),
                parent_block_hash=hashes[first - 1] if first else None,
                token_ids=tuple(token_ids[first * self.block_size :
                                          (first + len(new)) * self.block_size]),
                block_size=self.block_size,
            )
        )  # fmt: skip

    def free(self, blocks: list[Block]) -> None:
        """Release a sequence's blocks; tail blocks first, so prefixes are evicted last."""
        for block in reversed(blocks):
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block.block_id} freed twice"
            if block.ref_count == 0:
                self._free[block.block_id] = block
        blocks.clear()

    def clear(self) -> None:
        """Forget every cached block (an engine restart or reset)."""
        for block in self._blocks:
            if block.ref_count == 0 and block.block_hash is not None:
                del self._by_hash[block.block_hash]
                block.block_hash = None
        self.events.append(PoolCleared())

    def take_events(self) -> list[PoolEvent]:
        events, self.events = self.events, []
        return events

    def _take_free(self) -> Block:
        _, block = self._free.popitem(last=False)
        if block.block_hash is not None:
            del self._by_hash[block.block_hash]
            self.events.append(PoolBlocksEvicted(block_hashes=(block.block_hash,)))
            block.block_hash = None
        block.ref_count = 1
        return block
