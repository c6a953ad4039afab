"""``pdserve sim``: N simulated vLLM servers in one process, on consecutive ports.

Subcommands (``pdserve sim calibrate``, which lives with the benchmarks) are added by
the command line, so the sim imports neither the benchmarks nor the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import ipaddress
import os
import signal
from collections.abc import Sequence
from types import ModuleType

from aiohttp import web

from sim import DEFAULT_MAX_MODEL_LEN
from sim.faults import SimFaults
from sim.profile import load_profile
from sim.server import SimConfig, SimServer

Subcommand = tuple[str, str, ModuleType]


def add_arguments(parser: argparse.ArgumentParser, subcommands: Sequence[Subcommand] = ()) -> None:
    """The sim's flags; each of ``subcommands`` (name, help, module with ``add_arguments``
    and ``main``) becomes ``pdserve sim NAME``."""
    if subcommands:
        commands = parser.add_subparsers(dest="sim_command", required=False)
        for name, summary, module in subcommands:
            sub = commands.add_parser(name, help=summary, description=summary)
            module.add_arguments(sub)
            sub.set_defaults(sim_run=module.main)
    parser.add_argument("--model", help="model folder (its tokenizer is used)")
    parser.add_argument("--served-model-name")
    parser.add_argument("--role", choices=["colocated", "kv_producer", "kv_consumer"],
                        default="colocated")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, help="first sim's port")
    parser.add_argument("--count", type=int, default=1, help="sims, on consecutive ports")
    parser.add_argument("--profile", default="tiny-cpu", help="sim/profiles NAME or a JSON path")
    parser.add_argument("--kv-lease-s", type=float, default=30.0, help="producer block lease")
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    parser.add_argument("--block-size", type=int, default=None, help="default: the profile's")
    parser.add_argument("--prefix-caching-hash-algo", default="sha256",
                        choices=["sha256", "sha256_cbor"])  # fmt: skip
    parser.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="ZMQ endpoint for KV events (tcp://*:PORT binds; +1 per extra sim)",
    )
    parser.add_argument(
        "--kv-events-bind",
        action="store_true",
        help="bind the endpoint even with a named host (where vLLM would connect)",
    )
    parser.add_argument("--faults", default="{}", help='start with faults, e.g. {"slowdown": 2}')
    parser.add_argument("--seed", type=int, default=0, help="output tokens: f(seed, prompt)")
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="tokens per streamed chunk, as vLLM's flag")  # fmt: skip
    parser.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
                        help="as vLLM's flag: priority takes waiting requests by their "
                             "`priority` (lower first), then arrival")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    if getattr(args, "sim_command", None):
        return args.sim_run(args)
    missing = [f"--{n.replace('_', '-')}" for n in ("model", "served_model_name", "port")
               if getattr(args, n) is None]  # fmt: skip
    if missing:
        raise SystemExit(f"pdserve sim: {', '.join(missing)} required")
    if not 1 <= args.count <= 1000:
        raise SystemExit("--count must be between 1 and 1000")
    if args.stream_interval < 1:
        raise SystemExit("--stream-interval must be at least 1")
    profile = load_profile(args.profile)
    if args.block_size:
        profile = dataclasses.replace(profile, block_size_tokens=args.block_size)
    try:
        faults = SimFaults.model_validate_json(args.faults)
    except ValueError as error:
        raise SystemExit(f"--faults: {error}") from None
    admin_token = os.environ.get("PDSERVE_SIM_ADMIN_TOKEN") or None
    if admin_token is None and not _loopback(args.host):
        # Anyone who reaches /sim/faults can crash or hang the engine.
        raise SystemExit(
            f"pdserve sim: binding {args.host} beyond loopback needs PDSERVE_SIM_ADMIN_TOKEN "
            "(its fault and cache-reset endpoints would be open to the network)"
        )
    configs = [
        SimConfig(
            model_dir=args.model, served_model_name=args.served_model_name, role=args.role,
            host=args.host, port=args.port + index, profile=profile, seed=args.seed,
            kv_lease_s=args.kv_lease_s, max_model_len=args.max_model_len,
            kv_events_endpoint=_nth_endpoint(args.kv_events_endpoint, index),
            kv_events_bind=args.kv_events_bind, faults=faults, admin_token=admin_token,
            hash_algo=args.prefix_caching_hash_algo, stream_interval=args.stream_interval,
            scheduling_policy=args.scheduling_policy,
        )
        for index in range(args.count)
    ]  # fmt: skip
    asyncio.run(serve(configs))
    return 0


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _nth_endpoint(endpoint: str | None, index: int) -> str | None:
    """Sims in one process publish on consecutive ports."""
    if endpoint is None or index == 0:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + index}"


async def serve(configs: list[SimConfig]) -> None:
    """Run the sims until SIGTERM or SIGINT."""
    runners = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for config in configs:
            # A handler is cancelled when its client leaves, as vLLM aborts such a request
            # (streamed or not): the engine then frees its slot and KV blocks.
            runner = web.AppRunner(
                SimServer(config).app(), access_log=None, handler_cancellation=True
            )
            await runner.setup()
            await web.TCPSite(runner, config.host, config.port).start()
            runners.append(runner)
        print(f"sim: {len(configs)} {configs[0].role} sim(s) from port {configs[0].port}",
              flush=True)  # fmt: skip
        await stop.wait()
    finally:
        for runner in runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
