"""Decode role: one vLLM as NixlConnector ``kv_consumer``, pulling prompt KV and streaming.

What differs from prefill is the connector role alone: vLLM 0.32 reads the same
transport settings on both sides (the consumer renews the producer's block lease by
heartbeat, so both need ``--kv-lease-s``). KV headroom is reported in this agent's
heartbeats (``kv_cache_usage_perc``); the router's decode scorers read it, and decode
admission by headroom is the router's ``admit`` stage (issue 16), not an agent duty.
"""

from __future__ import annotations

import argparse

from agent.engine_spec import EngineSpec
from agent.runner import (
    add_engine_arguments,
    add_transport_arguments,
    nixl_spec,
    pd_respec,
    run_agent,
)
from contracts.workers import WorkerRole


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_transport_arguments(parser)


def build_spec(args: argparse.Namespace) -> EngineSpec:
    return nixl_spec(args, "kv_consumer")


def main(args: argparse.Namespace) -> int:
    return run_agent(WorkerRole.DECODE, build_spec(args), args, respec=pd_respec(args))
