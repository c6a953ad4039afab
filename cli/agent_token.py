"""``pdserve agent-token WORKER_ID``: mint a worker's agent token from the agent secret.

Run it where the secret is (``PDSERVE_AGENT_SECRET``, the router's ``agent_secret``) and
hand each agent only its own token (``PDSERVE_AGENT_TOKEN``): a token lets its holder
register, heartbeat and deregister that one worker id, nothing else.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from contracts.agent_tokens import agent_token
from localrun.cluster import write_private


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("worker_id", help="the worker id the agent will register as")
    parser.add_argument("--out", type=Path, default=None,
                        help="write it to this file (owner-only) instead of stdout: the "
                        "agent reads it through PDSERVE_AGENT_TOKEN_FILE")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    secret = os.environ.get("PDSERVE_AGENT_SECRET", "")
    if not secret:
        raise SystemExit("PDSERVE_AGENT_SECRET must be set (the router's agent_secret)")
    token = agent_token(secret, args.worker_id)
    if args.out is None:
        print(token)
        return 0
    write_private(args.out, token + "\n")
    return 0
