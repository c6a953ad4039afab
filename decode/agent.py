"""Decode role: pull prompt KV from a producer over NIXL and stream tokens.

Decode-side admission by KV headroom arrives with cache-aware routing; today the
router reads headroom from this agent's heartbeats (``kv_cache_usage_perc``).
"""

from __future__ import annotations

import argparse

from agent.engine_spec import EngineSpec
from agent.runner import add_engine_arguments, add_transport_arguments, nixl_spec, run_agent
from contracts.workers import WorkerRole


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_transport_arguments(parser)


def build_spec(args: argparse.Namespace) -> EngineSpec:
    return nixl_spec(args, "kv_consumer")


def main(args: argparse.Namespace) -> int:
    return run_agent(WorkerRole.DECODE, build_spec(args), args)
