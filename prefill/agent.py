"""Prefill role: compute prompt KV and keep it under a lease for a remote decode."""

from __future__ import annotations

import argparse

from agent.engine_spec import EngineSpec
from agent.runner import add_engine_arguments, add_transport_arguments, nixl_spec, run_agent
from contracts.workers import WorkerRole


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_transport_arguments(parser)


def build_spec(args: argparse.Namespace) -> EngineSpec:
    return nixl_spec(args, "kv_producer")


def main(args: argparse.Namespace) -> int:
    return run_agent(WorkerRole.PREFILL, build_spec(args), args)
