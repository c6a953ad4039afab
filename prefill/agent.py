"""Prefill role: one vLLM as NixlConnector ``kv_producer``, holding prompt KV for a decode.

The producer keeps a prompt's blocks for ``--kv-lease-s`` until a decode pulls them
(vLLM aborts and frees them after that); the router never forwards a handoff older
than its own lease (``kv_lease_s``, at most this one).
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
    return nixl_spec(args, "kv_producer")


def main(args: argparse.Namespace) -> int:
    return run_agent(WorkerRole.PREFILL, build_spec(args), args, respec=pd_respec(args))
