"""Where workers may be: the networks a worker's engine, KV events and NIXL host must be in.

A registration names hosts the router will then send users' prompts to (the engine), read
from (KV events) and have a decode engine pull KV from (the NIXL side channel, named in
each prefill's ``kv_transfer_params``). A stolen agent token must not point those at a
host of the thief's choosing, so each host must fall inside ``allowed_worker_networks``.

An IP literal is checked as it is. A host name is resolved at registration (off the event
loop) and must resolve inside the networks entirely; the names seen there are kept
(``max_names``, oldest dropped) so the request path checks a handoff's host without a
lookup. A name never seen at a registration is refused on the request path.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import OrderedDict
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class OutsideNetworks(ValueError):
    """A worker host outside ``allowed_worker_networks``."""


class WorkerNetworks:
    def __init__(self, cidrs: tuple[str, ...], *, max_names: int = 1024) -> None:
        self._networks: tuple[Network, ...] = tuple(
            ipaddress.ip_network(cidr, strict=False) for cidr in cidrs
        )
        self._names: OrderedDict[str, bool] = OrderedDict()
        self._max_names = max_names

    def __repr__(self) -> str:
        return f"WorkerNetworks({', '.join(map(str, self._networks))})"

    def _inside(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        return any(ip in network for network in self._networks)

    def allows(self, host: str) -> bool:
        """The request path's check: an IP literal, or a name a registration resolved."""
        host = host.strip("[]")
        try:
            return self._inside(host)
        except ValueError:
            return self._names.get(host.lower(), False)

    async def check_url(self, url: str, what: str) -> None:
        """Raise ``OutsideNetworks`` unless ``url``'s host is inside (names resolved)."""
        host = urlsplit(url).hostname
        if not host:
            raise OutsideNetworks(f"{what} {url!r} names no host")
        try:
            inside = self._inside(host)
        except ValueError:
            inside = await self._resolved_inside(host.lower())
        if not inside:
            allowed = ", ".join(map(str, self._networks))
            raise OutsideNetworks(
                f"{what} host {host!r} is outside allowed_worker_networks ({allowed})"
            )

    async def _resolved_inside(self, name: str) -> bool:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, None)
        except (OSError, UnicodeError):
            infos = []  # remembered as outside until a registration resolves it again
        inside = bool(infos) and all(self._inside(str(info[4][0])) for info in infos)
        self._names[name] = inside
        self._names.move_to_end(name)
        while len(self._names) > self._max_names:
            self._names.popitem(last=False)
        return inside
