"""``pdserve router``: serve ``create_app`` with uvicorn on uvloop."""

from __future__ import annotations

import argparse

import uvicorn

from contracts.logs import configure_logging
from router.app import create_app
from router.settings import RouterSettings, settings_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="HTTP port (default 8000)")
    parser.add_argument("--help-config", action="store_true", help="print every setting")


def main(args: argparse.Namespace) -> int:
    if args.help_config:
        print(settings_table())
        return 0
    configure_logging("router")
    settings = RouterSettings.from_env(host=args.host, port=args.port)
    uvicorn.run(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=10,
    )
    return 0
