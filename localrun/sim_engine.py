"""The simulator as an engine kind for the agent: its facts read from a timing profile.

The agent describes engines without importing the sim; whoever starts an agent or an
engine spec with ``engine="sim"`` (the command line, the benchmarks, the tests) reads
the profile here and hands the agent the numbers."""

from __future__ import annotations

from agent.engine_spec import SimFacts
from sim import DEFAULT_MAX_MODEL_LEN
from sim.profile import load_profile


def sim_facts(profile: str) -> SimFacts:
    timing = load_profile(profile)
    return SimFacts(
        block_size_tokens=timing.block_size_tokens,
        kv_capacity_tokens=timing.kv_capacity_tokens,
        max_model_len=DEFAULT_MAX_MODEL_LEN,
        accelerator=timing.accelerator,
    )
