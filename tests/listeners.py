"""Where a cluster's processes listen: every TCP socket in LISTEN state of the router,
the agents and everything they started (engines, their workers), with its address."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import psutil


def listeners(root_pids: Iterable[int]) -> list[tuple[int, str, str, int]]:
    """(pid, process name, address, port) of each listening TCP socket in the trees."""
    found = []
    for root in root_pids:
        try:
            tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for process in tree:
            try:
                sockets = process.net_connections(kind="tcp")
                name = process.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            found += [(process.pid, name, s.laddr.ip, s.laddr.port) for s in sockets
                      if s.status == psutil.CONN_LISTEN]  # fmt: skip
    return found


def beyond_loopback(found: list[tuple[int, str, str, int]]) -> list[tuple[int, str, str, int]]:
    return [entry for entry in found
            if not ipaddress.ip_address(entry[2].split("%")[0]).is_loopback]  # fmt: skip
