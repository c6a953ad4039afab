"""Prefill role: one vLLM as NixlConnector ``kv_producer``, holding prompt KV for a decode.

The producer keeps a prompt's blocks for ``--kv-lease-s`` until a decode pulls them
(vLLM aborts and frees them after that); the router never forwards a handoff older
than its own lease (``kv_lease_s``, at most this one).
"""

from __future__ import annotations

import argparse

from agent.roles.pd import add_arguments, serve
from contracts.workers import WorkerRole

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    return serve(WorkerRole.PREFILL, args)
