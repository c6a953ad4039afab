import pytest

from contracts.block_hashing import (
    block_hashes,
    external_block_hash,
    hash_block,
    hash_function,
    none_hash,
    sha256_pickle,
)

ROOT = none_hash(sha256_pickle)


@pytest.mark.parametrize(("tokens", "expected_blocks"), [(0, 0), (3, 0), (4, 1), (11, 2), (12, 3)])
def test_only_full_blocks_get_a_hash(tokens, expected_blocks):
    assert len(block_hashes(list(range(tokens)), 4, sha256_pickle, ROOT)) == expected_blocks


def test_hashes_chain_so_a_block_names_its_whole_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, sha256_pickle, ROOT)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4, sha256_pickle, ROOT)
    c = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0], 4, sha256_pickle, ROOT)
    assert a[1] != b[1], "same second block, different first block: different hash"
    assert c[:2] == a
    assert a[1] == hash_block(sha256_pickle, a[0], [5, 6, 7, 8])


def test_seed_and_algorithm_are_parameters():
    assert none_hash(sha256_pickle, "other-seed") != ROOT
    assert hash_function("sha256") is sha256_pickle
    with pytest.raises(ValueError, match="known"):
        hash_function("md5")


def test_external_hash_is_the_low_64_bits_big_endian():
    digest = bytes(range(32))
    assert external_block_hash(digest) == int.from_bytes(bytes(range(24, 32)), "big")


def test_the_memoized_hasher_equals_the_plain_chain_and_stays_within_its_cap():
    from contracts.block_hashing import MemoizedBlockHasher, sha256_cbor

    root = none_hash(sha256_cbor)
    hasher = MemoizedBlockHasher(sha256_cbor, root, max_entries=16)  # two lines of 8 blocks
    shared = list(range(256))  # two full lines of 8 blocks of 16
    for tail in range(5):
        tokens = shared + [1000 + tail] * (16 * tail + 5)  # 0-4 more blocks, a partial one
        assert hasher(tokens, 16) == block_hashes(tokens, 16, sha256_cbor, root)
        assert hasher(tokens, 16) == block_hashes(tokens, 16, sha256_cbor, root)  # memoized
    assert len(hasher._memo) == 2
