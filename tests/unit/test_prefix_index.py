"""The prefix index and the KV event feed that drives it (pure: no sockets, a fake clock)."""

from __future__ import annotations

import msgpack
import pytest

from contracts.kv_events import AllBlocksCleared, BlocksRemoved, BlocksStored, encode_batch
from router.scheduling.kv_event_feed import FeedState, KVEventFeed
from router.scheduling.prefix_index import PrefixIndex

A, B, C, D = 11, 22, 33, 44  # block hashes of one prompt, in order


def test_match_counts_only_the_leading_blocks_each_worker_holds():
    index = PrefixIndex(max_blocks=100)
    index.confirm("w0", [A, B, C])
    index.confirm("w1", [A, C, D])  # holds C and D, but not B: only A is reusable
    assert index.match([A, B, C, D], now_s=0) == {"w0": 3, "w1": 1}
    assert index.match([B, C], now_s=0) == {"w0": 2}
    assert index.match([D], now_s=0) == {"w1": 1}


def test_removed_blocks_and_cleared_workers_stop_matching():
    index = PrefixIndex(max_blocks=100)
    index.confirm("w0", [A, B, C])
    index.confirm("w1", [A, B])
    index.remove("w0", [B])
    assert index.match([A, B, C], now_s=0) == {"w0": 1, "w1": 2}
    assert index.clear_worker("w1") == 2
    assert index.match([A, B, C], now_s=0) == {"w0": 1}
    assert index.blocks_held("w1") == 0


def test_recorded_entries_expire_and_confirmed_ones_do_not():
    index = PrefixIndex(max_blocks=100)
    index.record("w0", [A, B], expires_s=10)
    index.confirm("w1", [A, B])
    assert index.match([A, B], now_s=5) == {"w0": 2, "w1": 2}
    assert index.match([A, B], now_s=10) == {"w1": 2}
    assert index.expire(now_s=10) == 2
    assert index.blocks_held("w0") == 0


def test_confirming_a_recorded_block_makes_it_permanent():
    index = PrefixIndex(max_blocks=100)
    index.record("w0", [A, B], expires_s=10)
    index.confirm("w0", [A])
    assert index.match([A, B], now_s=20) == {"w0": 1}
    assert index.expire(now_s=20) == 1  # B only


def test_recorded_entries_are_capped_per_worker_at_its_kv_capacity():
    index = PrefixIndex(max_blocks=100)
    index.record("w0", [A, B, C, D], expires_s=99, capacity_blocks=2)
    assert index.blocks_held("w0") == 2
    assert index.match([C, D], now_s=0) == {"w0": 2}  # the oldest (A, B) went first


def test_the_index_holds_at_most_max_blocks_dropping_the_least_recently_used():
    index = PrefixIndex(max_blocks=3)
    index.confirm("w0", [A, B, C])
    index.match([A], now_s=0)  # A is now the most recently used
    index.confirm("w1", [D])  # over capacity: B, the least recently used, goes
    assert len(index) == 3
    assert index.match([A], now_s=0) == {"w0": 1}
    assert index.match([B], now_s=0) == {}
    assert index.blocks_held("w0") == 2


def frames(sequence: int, events) -> list[bytes]:
    return [b"", sequence.to_bytes(8, "big"), encode_batch(list(events), ts=0.0)]


@pytest.fixture
def feed():
    clock = [100.0]
    index = PrefixIndex(max_blocks=100)
    seen: list[str] = []
    feed = KVEventFeed(
        index, fallback_s=30, clock=lambda: clock[0], on_event=lambda w, kind: seen.append(kind)
    )
    state = FeedState(endpoint="tcp://127.0.0.1:1", incarnation=1)
    feed._feeds["w0"] = state
    return feed, index, state, clock, seen


def stored(*hashes: int) -> BlocksStored:
    return BlocksStored(block_hashes=hashes, parent_block_hash=None, token_ids=(), block_size=16)


def test_events_apply_stored_removed_and_cleared(feed):
    feed, index, state, _, _ = feed
    feed._apply("w0", state, frames(0, [stored(A, B, C)]))
    assert index.match([A, B, C], now_s=0) == {"w0": 3}
    feed._apply("w0", state, frames(1, [BlocksRemoved((C,))]))
    assert index.match([A, B, C], now_s=0) == {"w0": 2}
    assert feed.is_live("w0")
    feed._apply("w0", state, frames(2, [AllBlocksCleared()]))
    assert index.match([A], now_s=0) == {}


def test_a_gap_drops_the_workers_entries_and_falls_back_for_a_while(feed):
    feed, index, state, clock, seen = feed
    feed._apply("w0", state, frames(0, [stored(A, B)]))
    feed._apply("w0", state, frames(5, [stored(C)]))  # batches 1-4 were lost
    assert seen[-2:] == ["gap", "batch"]
    assert index.match([A, B], now_s=0) == {}  # what it held before the gap is unknown
    assert index.match([C], now_s=0) == {"w0": 1}
    assert not feed.is_live("w0")
    clock[0] += 31
    assert feed.is_live("w0")


def test_a_sequence_that_restarts_is_an_engine_restart(feed):
    feed, index, state, _, seen = feed
    feed._apply("w0", state, frames(7, [stored(A)]))
    feed._apply("w0", state, frames(0, [stored(B)]))
    assert "restart" in seen
    assert index.match([A], now_s=0) == {}
    assert feed.is_live("w0")  # a restart is not a gap: the new engine's events are whole


def test_malformed_batches_are_counted_and_ignored(feed):
    feed, index, state, _, seen = feed
    feed._apply("w0", state, [b"", (0).to_bytes(8, "big"), b"\xc1not msgpack"])
    feed._apply("w0", state, [b"only one frame"])
    bad_timestamp = msgpack.packb(["yesterday", []])
    feed._apply("w0", state, [b"", (1).to_bytes(8, "big"), bad_timestamp])
    assert seen == ["malformed", "malformed", "malformed"]
    assert len(index) == 0


def test_routing_hashes_a_prompt_only_as_deep_as_the_index_matches():
    from contracts.block_hashing import (
        MemoizedBlockHasher,
        block_hashes,
        external_block_hash,
        none_hash,
        sha256_pickle,
    )
    from router.prepare.prompt_blocks import PromptBlocks

    calls = []

    def counting_sha256(value):
        calls.append(value)
        return sha256_pickle(value)

    root = none_hash(sha256_pickle)
    hasher = MemoizedBlockHasher(counting_sha256, root)
    held = list(range(64))  # 4 blocks of 16
    expected = [external_block_hash(h) for h in block_hashes(held, 16, sha256_pickle, root)]
    index = PrefixIndex(max_blocks=100)
    index.confirm("w0", expected[:1])  # only the first block is held anywhere

    blocks = PromptBlocks(len(held), 16, hasher.lazy(held, 16))
    assert index.match(blocks.leading(), now_s=0) == {"w0": 1}
    assert len(calls) == 2, "block 0 matched, block 1 did not: no reason to hash 2 and 3"
    assert blocks.all() == expected  # the record still gets every block, in order
    assert len(calls) == 4
    again = PromptBlocks(len(held), 16, hasher.lazy(held, 16))
    assert again.all() == expected and len(calls) == 4, "a repeated prompt comes from the memo"
    assert not PromptBlocks(15, 16, hasher.lazy(held[:15], 16)).known


async def test_the_router_hashes_with_the_seed_the_engine_registered():
    """An engine started with PYTHONHASHSEED hashes from another root; so must the router."""
    from contracts.block_hashing import block_hashes, external_block_hash, none_hash, sha256_pickle
    from contracts.workers import WorkerRegistration, WorkerRole
    from modelstore import tiny_llama
    from router.fleet.registry import WorkerState
    from router.prepare.prepare import Endpoint, PreparedRequest, measure_prompt
    from router.prepare.prompt_blocks import BlockHashers

    ids = list(range(100, 164))
    hashers = BlockHashers(memo_entries=1024)
    request = PreparedRequest(
        endpoint=Endpoint.COMPLETIONS, body={"model": "m", "prompt": ids}, model="m",
        stream=False, arrived_s=0.0, requested_model="m",
    )  # fmt: skip
    for seed in (None, "1234"):
        registration = WorkerRegistration(
            worker_id="p", role=WorkerRole.PREFILL, model="m", engine_url="http://e",
            block_size=16, tokenizer_path=str(tiny_llama.ensure()), prefix_hash_seed=seed,
        )  # fmt: skip
        workers = [WorkerState(registration, 0.0)]
        blocks = await measure_prompt(request, workers, hashers, offload_chars=1 << 20)
        root = none_hash(sha256_pickle, seed)
        assert blocks.all() == [
            external_block_hash(h) for h in block_hashes(ids, 16, sha256_pickle, root)
        ]
