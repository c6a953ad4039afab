"""NIXL/UCX transport configuration for vLLM's NixlConnector.

One function turns a role plus a few facts about the box into the
``--kv-transfer-config`` JSON and the environment vLLM reads. Keeping it here
means prefill and decode agents cannot drift apart on, say, the buffer device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

KVRole = Literal["kv_producer", "kv_consumer"]
BufferDevice = Literal["cpu", "cuda"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NixlTransport:
    """How one engine reaches its peers over NIXL.

    ``side_channel_port`` must be unique per engine on a host: decode engines
    connect to it to fetch the producer's memory descriptors.
    ``ucx_net_devices`` defaults to loopback so a local cluster never listens
    on a public interface; set it to e.g. ``mlx5_0:1`` on an RDMA fleet.
    """

    role: KVRole
    buffer_device: BufferDevice
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int
    ucx_net_devices: str | None = "lo"
    # UCX's transport list (``UCX_TLS``), e.g. ``rc,cuda_copy`` on an RDMA fleet; None:
    # UCX chooses. Engines that share a kernel but stand for separate hosts (the
    # multi-host tests' namespaces) need ``^sm``: UCX would otherwise move the blocks
    # through shared memory, which no two real hosts have.
    ucx_transports: str | None = None
    # How long a producer keeps blocks that no decode has pulled (NixlConnector's
    # ``kv_lease_duration``; decode renews it by heartbeat while pulling). The
    # router refuses handoffs older than this, so it must match the router's lease.
    kv_lease_s: int = 30
    # NIXL's progress thread waits up to this long for a UCX event before polling
    # again. NIXL's Python API hard-codes 0, a busy poll that holds a whole core
    # forever; on a shared box that core is another engine's. The engine-side
    # start-up hook (agent/engine_site) applies it; 0 keeps NIXL's busy poll.
    progress_delay_us: int = 1000

    def __post_init__(self) -> None:
        if not 0 < self.side_channel_port < 65536:
            raise ValueError(f"side_channel_port {self.side_channel_port} is not a port")
        if self.kv_lease_s < 6:
            # NixlConnector heartbeats every lease/6 s (integer): below 6 that is 0.
            raise ValueError("kv_lease_s must be at least 6 seconds")
        if not 0 <= self.progress_delay_us <= 1_000_000:
            raise ValueError("progress_delay_us must be within 0..1000000 (1 s)")

    def kv_transfer_config(self) -> str:
        """The JSON for vLLM's ``--kv-transfer-config``."""
        return json.dumps(
            {
                "kv_connector": "NixlConnector",
                "kv_role": self.role,
                "kv_buffer_device": self.buffer_device,
                # A failed KV load (the first request's NIXL handshake timing out on a
                # starved box, a producer gone) makes the decode compute the prompt
                # itself instead of answering 500 (vLLM 0.32's default is "fail").
                "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {"kv_lease_duration": self.kv_lease_s},
            },
            separators=(",", ":"),
        )

    def env(self) -> dict[str, str]:
        env = {
            "VLLM_NIXL_SIDE_CHANNEL_HOST": self.side_channel_host,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_channel_port),
        }
        if self.ucx_net_devices:
            env["UCX_NET_DEVICES"] = self.ucx_net_devices
        if self.ucx_transports:
            env["UCX_TLS"] = self.ucx_transports
        if self.progress_delay_us:
            env["PDSERVE_NIXL_PROGRESS_DELAY_US"] = str(self.progress_delay_us)
        return env
