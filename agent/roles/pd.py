"""What the two P/D roles share: one vLLM with NixlConnector, prefill as ``kv_producer``
and decode as ``kv_consumer``, the same transport flags on both sides.

A P/D agent can be re-roled at runtime (the SRE ratio API): ``pd_respec`` builds the
engine for either role from the same flags, so a prefill agent can come back as decode
and the other way round. The prefill and decode modules name their role and nothing else.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from agent.engine_spec import EngineSpec
from agent.runner import add_engine_arguments, base_spec_fields, run_agent
from contracts.workers import WorkerRole
from kvtransfer.transport import KVRole, NixlTransport


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag a P/D agent takes: the engine's and the transport's."""
    add_engine_arguments(parser)
    add_transport_arguments(parser)


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--side-channel-port", type=int, required=True, help="NIXL side channel")
    parser.add_argument("--kv-lease-s", type=int, default=30, help="producer block lease")
    parser.add_argument("--ucx-net-devices", default="lo", help='UCX devices ("" for all)')
    parser.add_argument("--ucx-tls", default=None,
                        help="UCX transports (UCX_TLS), e.g. rc,cuda_copy; default: UCX's "
                        "choice")  # fmt: skip
    parser.add_argument("--nixl-progress-delay-us", type=int, default=1000,
                        help="how long NIXL's progress thread waits for a UCX event before "
                        "polling again (0: NIXL's busy poll, a whole core per engine)")  # fmt: skip


def nixl_spec(args: argparse.Namespace, kv_role: KVRole) -> EngineSpec:
    """The engine for a P/D role: NixlConnector with the side channel on the engine's host."""
    fields = base_spec_fields(args)
    transport = NixlTransport(
        role=kv_role,
        buffer_device="cuda" if fields["device"] == "cuda" else "cpu",
        side_channel_host=args.host,
        side_channel_port=args.side_channel_port,
        ucx_net_devices=args.ucx_net_devices or None,
        ucx_transports=args.ucx_tls or None,
        kv_lease_s=args.kv_lease_s,
        progress_delay_us=args.nixl_progress_delay_us,
    )
    return EngineSpec(**fields, transport=transport)


KV_ROLES: dict[WorkerRole, KVRole] = {
    WorkerRole.PREFILL: "kv_producer",
    WorkerRole.DECODE: "kv_consumer",
}


def pd_respec(args: argparse.Namespace) -> Callable[[WorkerRole], EngineSpec]:
    """How a P/D agent builds its engine for either role: a re-role changes the NIXL role
    and nothing else (the side channel, lease and devices are the same flags)."""
    return lambda role: nixl_spec(args, KV_ROLES[role])


def serve(role: WorkerRole, args: argparse.Namespace) -> int:
    """Run a P/D agent that starts as ``role`` and may be re-roled to the other."""
    respec = pd_respec(args)
    return run_agent(role, respec(role), args, respec=respec)
