"""A prompt's block hashes as vLLM computes them, hashed only as deep as routing reads.

``BlockHashers`` keeps one memoizing hasher per (algorithm, seed) a pool registered,
so blocks shared by many prompts (a system prompt) are hashed once.
"""

from __future__ import annotations

from collections.abc import Iterator

from contracts.block_hashing import HashedBlock, MemoizedBlockHasher, hash_function, none_hash


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


class BlockHashers:
    def __init__(self, *, memo_entries: int) -> None:
        self._memo_entries = memo_entries
        self._hashers: dict[tuple[str, str | None], MemoizedBlockHasher] = {}

    def __repr__(self) -> str:
        return f"BlockHashers({sorted(self._hashers)})"

    def blocks(
        self, token_ids: list[int], *, block_size: int, algorithm: str, seed: str | None
    ) -> PromptBlocks:
        hasher = self._hashers.get((algorithm, seed))
        if hasher is None:
            hash_fn = hash_function(algorithm)
            hasher = self._hashers[(algorithm, seed)] = MemoizedBlockHasher(
                hash_fn, none_hash(hash_fn, seed), self._memo_entries
            )
        return PromptBlocks(len(token_ids), block_size, hasher.lazy(token_ids, block_size))
