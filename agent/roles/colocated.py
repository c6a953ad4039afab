"""Colocated role: a plain vLLM that prefills and decodes itself (no P/D)."""

from __future__ import annotations

import argparse

from agent.engine_spec import EngineSpec
from agent.runner import add_engine_arguments, base_spec_fields, run_agent
from contracts.workers import WorkerRole


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)


def main(args: argparse.Namespace) -> int:
    return run_agent(WorkerRole.COLOCATED, EngineSpec(**base_spec_fields(args)), args)
