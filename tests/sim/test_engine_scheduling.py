"""The sim engine's --scheduling-policy, as vLLM's: which waiting request runs next."""

import asyncio
import dataclasses
import time

import pytest

from contracts.block_hashing import none_hash, sha256_pickle
from sim.engine import SimEngine, SimRequest
from sim.profile import load_profile


def engine_of(policy: str, *, max_num_seqs: int = 1, kv_blocks: int = 100) -> SimEngine:
    profile = dataclasses.replace(
        load_profile("llama3-8b-h100"), max_num_seqs=max_num_seqs, block_size_tokens=16,
        kv_capacity_tokens=16 * kv_blocks,
    )  # fmt: skip
    return SimEngine(
        profile=profile, hash_fn=sha256_pickle, root_hash=none_hash(sha256_pickle),
        lease_s=5.0, clock=time.monotonic, scheduling_policy=policy,
    )  # fmt: skip


async def finish_order(engine: SimEngine, priorities: dict[str, int]) -> list[str]:
    """Requests added (in this order) while the engine is held, then run."""
    engine.gate.clear()
    loop = asyncio.create_task(engine.run())
    requests = [
        SimRequest(request_id=name, prompt_token_ids=[index + 1] * 40, output_token_ids=[7],
                   priority=priority)
        for index, (name, priority) in enumerate(priorities.items())
    ]  # fmt: skip
    for request in requests:
        engine.add(request)
    finished: list[str] = []

    async def drain(request: SimRequest) -> None:
        while await request.tokens.get() is not None:
            pass
        finished.append(request.request_id)

    engine.gate.set()
    try:
        await asyncio.wait_for(asyncio.gather(*(drain(r) for r in requests)), timeout=10)
    finally:
        loop.cancel()
    return finished


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("priority", ["interactive", "standard", "batch", "batch-later"]),
     ("fcfs", ["batch", "interactive", "standard", "batch-later"])],
)  # fmt: skip
def test_waiting_requests_run_by_priority_then_arrival_only_under_the_priority_policy(
    policy, expected
):
    priorities = {"batch": 2, "interactive": 0, "standard": 1, "batch-later": 2}
    assert asyncio.run(finish_order(engine_of(policy), priorities)) == expected


async def preempted_under(policy: str) -> tuple[str, int]:
    """A batch line decodes; an interactive request joins it; KV runs out. Which one is
    preempted (finishes last), and how many preemptions there were."""
    # Three blocks of 16: each one-block prompt needs a second block at its 17th token.
    engine = engine_of(policy, max_num_seqs=2, kv_blocks=3)
    loop = asyncio.create_task(engine.run())
    finished: list[str] = []

    async def run(name: str, priority: int, started: asyncio.Event) -> None:
        request = SimRequest(request_id=name, prompt_token_ids=[priority + 1] * 15,
                             output_token_ids=[7] * 24, priority=priority)  # fmt: skip
        engine.add(request)
        while await request.tokens.get() is not None:
            started.set()
        finished.append(name)

    try:
        batch_started, interactive_started = asyncio.Event(), asyncio.Event()
        batch = asyncio.create_task(run("batch", 2, batch_started))
        await asyncio.wait_for(batch_started.wait(), timeout=10)  # it runs first
        interactive = run("interactive", 0, interactive_started)
        await asyncio.wait_for(asyncio.gather(batch, interactive), timeout=10)
    finally:
        loop.cancel()
    return finished[-1], engine.stats.preemptions


@pytest.mark.parametrize(("policy", "preempted"), [("priority", "batch"), ("fcfs", "interactive")])
def test_when_kv_runs_out_the_priority_policy_preempts_the_lowest_class(policy, preempted):
    # vLLM's fcfs preempts the request last taken into the batch (the interactive one,
    # which came second), priority the lowest class (the batch line) whenever it came.
    last, preemptions = asyncio.run(preempted_under(policy))
    assert preemptions >= 1
    assert last == preempted
