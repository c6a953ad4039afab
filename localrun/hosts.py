"""Where a local cluster's process runs: an address it binds and peers reach it by, and
how to start a command there.

On one box every process is on loopback (``LOOPBACK``). The multi-host tests place each
process in a network namespace of its own (``tests/netns.py``): its own address on a
veth, and ``ip netns exec NAME`` in front of its command. Nothing in a cluster may
assume loopback past this module: a process binds ``address``, and its peers are told
``address``; the NIXL/UCX transport is pinned to ``interface``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Host:
    address: str
    # argv that runs a command on this host (``("ip", "netns", "exec", "ns1")``); () here.
    run_prefix: tuple[str, ...] = ()
    # The network device the host's peers reach it through: UCX (NIXL's KV transfer) is
    # pinned to it, so that a worker never listens for KV on a device it was not given.
    interface: str = "lo"
    # UCX's transports on this host (``UCX_TLS``); None: UCX's choice.
    ucx_transports: str | None = None

    def url(self, port: int, scheme: str = "http") -> str:
        return f"{scheme}://{self.address}:{port}"


LOOPBACK = Host("127.0.0.1")
