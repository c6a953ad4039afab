"""``pdserve agent-token WORKER_ID``: mint a worker's agent token from the agent secret.

Run it where the secret is (``PDSERVE_AGENT_SECRET``, the router's ``agent_secret``) and
hand each agent only its own token (``PDSERVE_AGENT_TOKEN``): a token lets its holder
register, heartbeat and deregister that one worker id, nothing else.
"""

from __future__ import annotations

import argparse
import os

from contracts.agent_tokens import agent_token


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("worker_id", help="the worker id the agent will register as")


def main(args: argparse.Namespace) -> int:
    secret = os.environ.get("PDSERVE_AGENT_SECRET", "")
    if not secret:
        raise SystemExit("PDSERVE_AGENT_SECRET must be set (the router's agent_secret)")
    print(agent_token(secret, args.worker_id))
    return 0
