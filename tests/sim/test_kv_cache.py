import pytest

from contracts.block_hashing import block_hashes, none_hash, sha256_pickle
from sim.kv_cache import KVBlockPool, PoolBlocksEvicted, PoolBlocksStored, PoolCleared

ROOT = none_hash(sha256_pickle)


def hashes(tokens, block_size=4):
    return block_hashes(tokens, block_size, sha256_pickle, ROOT)


def run_sequence(pool, tokens):
    """Allocate, compute and release one sequence; return its blocks' ids."""
    seq_hashes = hashes(tokens, pool.block_size)
    blocks = pool.allocate(seq_hashes, -(-len(tokens) // pool.block_size))
    assert blocks is not None
    ids = [b.block_id for b in blocks]
    pool.store(blocks, seq_hashes, tokens)
    pool.free(blocks)
    return ids


def test_a_repeated_prefix_is_found_and_its_blocks_revived():
    pool = KVBlockPool(num_blocks=8, block_size=4)
    first = run_sequence(pool, list(range(8)))
    assert pool.cached_prefix_blocks(hashes(list(range(8)) + [99] * 4)) == 2
    blocks = pool.allocate(hashes(list(range(8)) + [99] * 4), 3)
    assert [b.block_id for b in blocks[:2]] == first
    assert pool.usage == pytest.approx(3 / 8)


def test_store_and_eviction_emit_vllm_style_events_in_order():
    pool = KVBlockPool(num_blocks=2, block_size=4)
    run_sequence(pool, [1, 2, 3, 4, 5, 6, 7, 8])
    stored = pool.take_events()
    a, b = hashes([1, 2, 3, 4, 5, 6, 7, 8])
    assert stored == [PoolBlocksStored((a, b), None, (1, 2, 3, 4, 5, 6, 7, 8), 4)]
    run_sequence(pool, [9, 9, 9, 9])  # needs one block: evicts the least recently freed
    events = pool.take_events()
    assert isinstance(events[0], PoolBlocksEvicted)
    assert isinstance(events[1], PoolBlocksStored) and events[1].parent_block_hash is None


def test_tail_blocks_are_evicted_before_their_prefix():
    pool = KVBlockPool(num_blocks=3, block_size=4)
    run_sequence(pool, list(range(12)))
    run_sequence(pool, [50] * 4)
    removed = [e for e in pool.take_events() if isinstance(e, PoolBlocksEvicted)]
    assert removed == [PoolBlocksEvicted((hashes(list(range(12)))[2],))]
    assert pool.cached_prefix_blocks(hashes(list(range(12)))) == 2


def test_allocation_that_cannot_fit_changes_nothing():
    pool = KVBlockPool(num_blocks=2, block_size=4)
    held = pool.allocate(hashes([1, 2, 3, 4]), 1)
    assert pool.allocate(hashes([5, 6, 7, 8, 9, 10, 11, 12]), 2) is None
    assert pool.free_blocks == 1 and held is not None


def test_clear_forgets_free_cached_blocks_and_says_so():
    pool = KVBlockPool(num_blocks=4, block_size=4)
    run_sequence(pool, [1, 2, 3, 4])
    pool.take_events()
    pool.clear()
    assert pool.take_events() == [PoolCleared()]
    assert pool.cached_prefix_blocks(hashes([1, 2, 3, 4])) == 0


def test_double_free_is_an_invariant_violation():
    pool = KVBlockPool(num_blocks=2, block_size=4)
    blocks = pool.allocate([], 1)
    alias = list(blocks)
    pool.free(blocks)
    with pytest.raises(AssertionError):
        pool.free(alias)
