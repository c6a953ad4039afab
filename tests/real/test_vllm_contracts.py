"""Our shared contracts against vLLM's own code (imports vLLM, starts no engine)."""

import pytest

from contracts.block_hashing import (
    HASH_FUNCTIONS,
    block_hashes,
    engine_hash_seed,
    external_block_hash,
    hash_function,
    none_hash,
    sha256_pickle,
)
from sim.kv_cache import PoolBlocksEvicted, PoolBlocksStored, PoolCleared
from sim.kv_events import encode_batch


@pytest.mark.parametrize("python_hash_seed", [None, "1234"])
@pytest.mark.parametrize("algorithm", sorted(HASH_FUNCTIONS))
def test_hash_chain_equals_vllms(algorithm, python_hash_seed, monkeypatch):
    """Also with PYTHONHASHSEED set, which vLLM takes as its NONE_HASH seed."""
    import os

    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    if python_hash_seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", python_hash_seed)
    theirs_fn = get_hash_fn_by_name(algorithm)
    kv_cache_utils.init_none_hash(theirs_fn)
    tokens = list(range(1000, 1000 + 3 * 16 + 5))
    theirs, parent = [], None
    for start in range(0, 48, 16):
        parent = kv_cache_utils.hash_block_tokens(theirs_fn, parent, tokens[start : start + 16])
        theirs.append(bytes(parent))
    ours = hash_function(algorithm)
    root = none_hash(ours, engine_hash_seed(os.environ))
    assert block_hashes(tokens, 16, ours, root) == theirs


def test_sim_kv_events_decode_with_vllms_own_types():
    import msgspec
    from vllm.distributed import kv_events as vllm_events

    first, second = block_hashes(list(range(32)), 16, sha256_pickle, none_hash(sha256_pickle))
    ours = [
        PoolBlocksStored((first, second), None, tuple(range(32)), 16),
        PoolBlocksEvicted((second,)),
        PoolCleared(),
    ]
    batch = msgspec.msgpack.Decoder(type=vllm_events.KVEventBatch).decode(
        encode_batch(ours, ts=12.5)
    )
    stored, removed, cleared = batch.events
    assert batch.ts == 12.5
    assert isinstance(stored, vllm_events.BlockStored)
    assert stored.block_hashes == [external_block_hash(first), external_block_hash(second)]
    assert stored.parent_block_hash is None
    assert stored.token_ids == list(range(32)) and stored.block_size == 16
    assert isinstance(removed, vllm_events.BlockRemoved)
    assert removed.block_hashes == [external_block_hash(second)]
    assert isinstance(cleared, vllm_events.AllBlocksCleared)
