"""Our block hashes equal vLLM's own for the same tokens (imports vLLM, no engine)."""

from contracts.block_hashing import block_hashes, none_hash, sha256_pickle


def test_hash_chain_equals_vllms():
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils.init_none_hash(sha256)
    tokens = list(range(1000, 1000 + 3 * 16 + 5))
    theirs, parent = [], None
    for start in range(0, 48, 16):
        parent = kv_cache_utils.hash_block_tokens(sha256, parent, tokens[start : start + 16])
        theirs.append(bytes(parent))
    assert block_hashes(tokens, 16, sha256_pickle, none_hash(sha256_pickle)) == theirs
