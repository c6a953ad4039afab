"""Embed role: one vLLM on its pooling runner, serving ``/v1/embeddings`` for an
embedding model (all-MiniLM-L6-v2 here). It holds no KV a later request reuses, so it
publishes no KV events, and it prefills no prompt the router forecasts (no probe)."""

from __future__ import annotations

import argparse

from agent.engine_spec import EngineSpec
from agent.runner import add_engine_arguments, base_spec_fields, run_agent
from contracts.workers import WorkerRole

# vLLM picks the pooler (mean pooling, normalization) from the folder's
# sentence-transformers files (modules.json, 1_Pooling/config.json).
POOLING_ARGS = ("--runner", "pooling")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)


def main(args: argparse.Namespace) -> int:
    fields = base_spec_fields(args)
    fields["extra_args"] = (*POOLING_ARGS, *fields["extra_args"])
    return run_agent(WorkerRole.EMBED, EngineSpec(**fields), args)
