"""Several hosts on one box: Linux network namespaces joined by a switch.

Each host is a namespace with loopback and one veth (``pd0``) holding its own address
on a private /24. The other ends of the veths hang on a bridge that lives in a
namespace of its own, the switch, so that the box's own firewall and routes never see
this traffic. The box itself (the test process) is one more host on the switch, at
``.1``: it plays the client and the operator, and reaches every host by its address.

Needs root (``ip netns``); CI runs as root. Everything made here is removed on exit,
processes still inside a namespace included (the caller stops its own first).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from localrun.cluster import LocalCluster
from localrun.hosts import Host

INTERFACE = "pd0"


def available() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


@dataclass(frozen=True, slots=True)
class Network:
    tag: str
    subnet: ipaddress.IPv4Network
    hosts: dict[str, Host]

    @property
    def box_address(self) -> str:
        """The test process's own address on the switch."""
        return str(self.subnet.network_address + 1)

    def namespace(self, name: str) -> str:
        return f"pd{self.tag}-{name}"

    def counters(self, name: str) -> dict[str, int]:
        """A host's interface byte counters (``rx_bytes``, ``tx_bytes``)."""
        base = f"/sys/class/net/{INTERFACE}/statistics"
        out = subprocess.run(
            ["ip", "netns", "exec", self.namespace(name), "cat",
             f"{base}/rx_bytes", f"{base}/tx_bytes"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.split()  # fmt: skip
        return {"rx_bytes": int(out[0]), "tx_bytes": int(out[1])}

    def listeners(self, name: str) -> list[str]:
        """Local addresses of every TCP socket listening in a host (``ss -ltn``)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.namespace(name), "ss", "-Hltn"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip
        return [line.split()[3] for line in out.splitlines() if line.strip()]

    def strays(self, name: str) -> list[str]:
        """Listeners of a host's on neither its own address nor its loopback (which is
        that host's alone: vLLM's internal sockets live there): 0.0.0.0, ``[::]`` or a
        peer's address would all be wrong."""
        own = ipaddress.ip_address(self.hosts[name].address)
        strays = []
        for local in self.listeners(name):
            address = ipaddress.ip_address(local.rsplit(":", 1)[0].strip("[]").split("%")[0])
            if not (address.is_loopback or address == own):
                strays.append(local)
        return strays


@dataclass(frozen=True, slots=True)
class Fleet:
    """A cluster spread over a network's hosts, with a second router replica."""

    net: Network
    cluster: LocalCluster
    replica_url: str

    @property
    def router_url(self) -> str:
        return self.cluster.router_url

    @property
    def routers(self) -> tuple[str, str]:
        return self.cluster.router_url, self.replica_url

    def engine_url(self, worker: str) -> str:
        return self.cluster.worker(worker).engine_url


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 no interface of the box's is on."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    rng = random.SystemRandom()
    for _ in range(100):
        subnet = ipaddress.IPv4Network(f"10.{rng.randrange(64, 250)}.{rng.randrange(256)}.0/24")
        if f" {subnet.network_address + 1}/" not in used and str(subnet)[:-5] not in used:
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 subnet")


@contextlib.contextmanager
def network(names: Sequence[str]) -> Iterator[Network]:
    """Namespaces named ``names``, each a host on one switch; removed on exit."""
    tag = f"{random.SystemRandom().randrange(16**4):04x}"
    subnet = _free_subnet()
    net = Network(tag, subnet, {})
    switch = net.namespace("sw")
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        # The box's own leg: a veth into the switch, at .1.
        _attach(switch, "box", f"pd{tag}box", None, f"{net.box_address}/24")
        for index, name in enumerate(names):
            namespace = net.namespace(name)
            _ip("netns", "add", namespace)
            made.append(namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
            address = str(subnet.network_address + 2 + index)
            _attach(switch, f"h{index}", INTERFACE, namespace, f"{address}/24")
            net.hosts[name] = Host(
                address, ("ip", "netns", "exec", namespace), INTERFACE,
                # One kernel under all the hosts: left to itself, UCX moves KV blocks
                # between them through shared memory (7.6 KB crossed the wire for a
                # 1,212-token prompt), which separate machines cannot do.
                ucx_transports="^sm",
            )  # fmt: skip
        yield net
    finally:
        for namespace in reversed(made):
            _kill_inside(namespace)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", f"pd{tag}box"], capture_output=True, timeout=30)


def _attach(switch: str, leg: str, device: str, namespace: str | None, cidr: str) -> None:
    """A veth from ``namespace`` (None: the box) to the switch's bridge: ``leg`` on the
    switch's side, ``device`` holding ``cidr`` on the host's."""
    if namespace is None:
        _ip("link", "add", device, "type", "veth", "peer", "name", leg, "netns", switch)
    else:
        _ip("-n", switch, "link", "add", leg, "type", "veth", "peer", "name", device,
            "netns", namespace)  # fmt: skip
    _ip("-n", switch, "link", "set", leg, "master", "br0", "up")
    where = ("-n", namespace) if namespace else ()
    _ip(*where, "addr", "add", cidr, "dev", device)
    _ip(*where, "link", "set", device, "up")


def _kill_inside(namespace: str) -> None:
    """SIGKILL whatever still runs in ``namespace``: a leftover would keep it alive."""
    pids = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30
    ).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
