"""Decode role: one vLLM as NixlConnector ``kv_consumer``, pulling prompt KV and streaming.

What differs from prefill is the connector role alone: vLLM 0.32 reads the same
transport settings on both sides (the consumer renews the producer's block lease by
heartbeat, so both need ``--kv-lease-s``). KV headroom is reported in this agent's
heartbeats (``kv_cache_usage_perc``); the router's decode scorers read it, and decode
admission by headroom is the router's ``admit`` stage (issue 16), not an agent duty.
"""

from __future__ import annotations

import argparse

from agent.roles.pd import add_arguments, serve
from contracts.workers import WorkerRole

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    return serve(WorkerRole.DECODE, args)
