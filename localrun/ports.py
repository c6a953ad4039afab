"""Free-port allocation for local processes.

Ports are chosen below the kernel's ephemeral range (``ip_local_port_range``). A port
taken from inside that range with ``bind(0)`` is free only until the kernel hands it out
again, as some process's outgoing connection or another ``bind(0)``: on a busy box a vLLM
engine restarted on a KV-events port that had been handed out that way failed with
"Address already in use" on every restart (CI saw a worker never get ready). Below the
range, only a process that names the port itself can take it.

Two launchers choosing at the same moment (the tests' parallel workers, say) could still
both find a port free before either binds it. Each chosen port is therefore reserved for
``RESERVATION_S`` by a file in a per-user folder under the temp dir (created with
``O_EXCL``): other choosers on the box skip it while it is fresh. CI saw a sim's KV-events
port taken that way, and the worker never got ready.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

_LOWEST = 10_000  # above the registered services most boxes run
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVATION_S = 600.0  # long enough for a cluster to start and bind what it was given
_RESERVATIONS = Path(tempfile.gettempdir()) / f"pdserve-ports-{os.getuid()}"


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports, free a moment ago and outside the kernel's ephemeral range
    (random among them, so two launchers on one box rarely pick the same)."""
    end = _ephemeral_start()
    if end - _LOWEST < count * 10:
        raise RuntimeError(f"too few ports below the ephemeral range ({_LOWEST}-{end})")
    rng = random.SystemRandom()
    chosen: list[int] = []
    for _ in range(count * 200):
        if len(chosen) == count:
            return chosen
        port = rng.randrange(_LOWEST, end)
        if port not in chosen and _bindable(port, host) and _reserved(port):
            chosen.append(port)
    if len(chosen) == count:
        return chosen
    raise RuntimeError(f"found {len(chosen)} of {count} free ports below {end}")


def _reserved(port: int) -> bool:
    """Reserve ``port`` for this chooser; False if another holds a fresh reservation."""
    _RESERVATIONS.mkdir(mode=0o700, exist_ok=True)
    marker = _RESERVATIONS / str(port)
    for _ in range(2):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            try:
                if time.time() - marker.stat().st_mtime < RESERVATION_S:
                    return False
                marker.unlink()  # stale: its launcher has long bound the port or gone
            except FileNotFoundError:
                pass
    return False
