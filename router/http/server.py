"""``pdserve router``: serve ``create_app`` with uvicorn on uvloop, in one process or several.

With ``router_processes`` > 1, uvicorn's supervisor starts that many processes on one
listening socket. Each builds its router from the environment (``app_from_env``), so
what the command line set is passed on through ``PDSERVE_*``. They share state through
Redis (required), and their metrics through prometheus-client's multiprocess directory,
which this parent creates empty and removes at exit.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile

import uvicorn

from contracts.logs import configure_logging
from router.http.app import create_app
from router.orchestration.sse_passthrough import ClientSockets
from router.settings import RouterSettings, settings_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="HTTP port (default 8000)")
    parser.add_argument("--processes", type=int, default=None, help="router processes (default 1)")
    parser.add_argument("--help-config", action="store_true", help="print every setting")


def main(args: argparse.Namespace) -> int:
    if args.help_config:
        print(settings_table())
        return 0
    configure_logging("router")
    settings = RouterSettings.from_env(
        host=args.host, port=args.port, router_processes=args.processes
    )
    server = settings.server
    options = dict(
        host=server.host, port=server.port, loop="uvloop", http="httptools", access_log=False,
        log_level="warning", timeout_graceful_shutdown=10,
        # No X-Forwarded-* rewriting: nothing here trusts a client address, and the
        # middleware costs CPU on every request.
        proxy_headers=False,
    )  # fmt: skip
    if server.router_processes == 1:
        uvicorn.run(ClientSockets(create_app(settings)), **options)  # type: ignore[arg-type]
        return 0
    if not settings.control.state_url:
        raise SystemExit(
            "router_processes > 1 needs PDSERVE_STATE_URL (Redis): the processes share "
            "workers, pools and rate limits through it"
        )
    os.environ.update(
        PDSERVE_HOST=server.host, PDSERVE_PORT=str(server.port),
        PDSERVE_ROUTER_PROCESSES=str(server.router_processes),
        PROMETHEUS_MULTIPROC_DIR=_empty_metrics_dir(),
    )  # fmt: skip
    uvicorn.run(
        "router.http.server:app_from_env", factory=True, workers=server.router_processes, **options
    )  # type: ignore[arg-type]
    return 0


def app_from_env() -> ClientSockets:
    """One router process of several (uvicorn's factory): settings from the environment."""
    configure_logging("router")
    return ClientSockets(create_app(RouterSettings.from_env()))


def _empty_metrics_dir() -> str:
    """The given multiprocess directory emptied (old processes' files would add up), or a
    fresh one removed at exit."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        os.makedirs(given, exist_ok=True)
        for name in os.listdir(given):
            if name.endswith(".db"):
                os.remove(os.path.join(given, name))
        return given
    directory = tempfile.mkdtemp(prefix="pdserve-router-metrics-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory
