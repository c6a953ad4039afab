"""A sim's KV events: vLLM's wire format, vLLM's block hashes, vLLM's endpoint rules."""

from __future__ import annotations

import asyncio

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio
from aiohttp import web

from contracts.block_hashing import block_hashes, external_block_hash, none_hash, sha256_pickle
from localrun.ports import free_ports
from modelstore import tiny_llama
from sim.profile import load_profile
from sim.server import SimConfig, SimServer


@pytest.fixture
async def sim_with_subscriber():
    """A sim that connects to a SUB socket this test binds (an endpoint with a host)."""
    sim_port, events_port = free_ports(2)
    profile = load_profile("tiny-cpu")
    context = zmq.asyncio.Context()
    subscriber = context.socket(zmq.SUB)
    subscriber.bind(f"tcp://127.0.0.1:{events_port}")
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    config = SimConfig(
        model_dir=str(tiny_llama.ensure()), served_model_name="m", port=sim_port,
        profile=profile, kv_events_endpoint=f"tcp://127.0.0.1:{events_port}",
    )  # fmt: skip
    runner = web.AppRunner(SimServer(config).app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", sim_port).start()
    try:
        yield f"http://127.0.0.1:{sim_port}", subscriber, profile.block_size_tokens
    finally:
        await runner.cleanup()
        subscriber.close(linger=0)
        context.term()


async def test_block_stored_carries_vllm_hashes_of_the_prompt(sim_with_subscriber):
    url, subscriber, block_size = sim_with_subscriber
    async with aiohttp.ClientSession() as session:

        async def complete(prompt: list[int]) -> None:
            body = {"model": "m", "prompt": prompt, "max_tokens": 2}
            async with session.post(url + "/v1/completions", json=body) as response:
                assert response.status == 200

        # ZMQ drops what is sent before the connection is up: fresh prompts until one arrives.
        for attempt in range(100):
            await complete([7, attempt] * block_size)
            if await subscriber.poll(100):
                break
        while await subscriber.poll(200):
            await subscriber.recv_multipart()
        prompt = list(range(100, 100 + 3 * block_size + 7))
        await complete(prompt)
    topic, sequence, payload = await asyncio.wait_for(subscriber.recv_multipart(), 5)
    assert topic == b"" and len(sequence) == 8
    ts, events = msgpack.unpackb(payload)
    stored = [e for e in events if e["type"] == "BlockStored"]
    expected = block_hashes(prompt, block_size, sha256_pickle, none_hash(sha256_pickle))
    assert stored[0]["block_hashes"] == [external_block_hash(h) for h in expected]
    assert stored[0]["parent_block_hash"] is None
    assert stored[0]["token_ids"] == prompt[: 3 * block_size]
    assert stored[0]["block_size"] == block_size and ts > 0
