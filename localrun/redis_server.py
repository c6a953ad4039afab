"""A redis-server of our own on a free port (tests and benchmarks; `make redis`).

No persistence; it binds its host's address only (loopback unless placed elsewhere). Off
loopback it requires a password, which its URL carries: Redis' protected mode refuses
peers on other hosts otherwise, and rightly. The port survives ``stop()``/``start()``, so
an outage can be staged and ended.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from agent import process_group
from localrun.cluster import write_private
from localrun.hosts import LOOPBACK, Host
from localrun.ports import free_ports


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=0.5).ping())
    except redis.exceptions.ConnectionError:
        return False


class RedisServer:
    def __init__(self, workdir: Path, host: Host = LOOPBACK) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make redis`")
        (self.port,) = free_ports(1)
        self._argv = [*host.run_prefix, binary, "--port", str(self.port), "--bind", host.address,
                      "--save", "", "--appendonly", "no", "--dir", str(workdir)]  # fmt: skip
        self.url = f"{host.url(self.port, 'redis')}/0"
        if not ipaddress.ip_address(host.address).is_loopback:
            password = secrets.token_urlsafe(18)
            # From a file, not argv: a password on a command line is in every `ps`.
            config = workdir / f"redis-{self.port}.conf"
            write_private(config, f"requirepass {password}\n")
            self._argv.insert(len(host.run_prefix) + 1, str(config))
            self.url = f"redis://:{password}@{host.address}:{self.port}/0"
        self._process: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"RedisServer({self._argv[self._argv.index('--bind') + 1]}:{self.port})"

    def start(self, timeout_s: float = 10) -> None:
        # It dies with its starter, as every process pdserve starts (agent.process_group).
        process = self._process = subprocess.Popen(
            self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            preexec_fn=process_group.die_with_parent(),
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while not _answers(self.url):
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server not answering after {timeout_s:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown (a restart comes back empty either way)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)
            self._process = None

    @property
    def running(self) -> bool:
        return self._process is not None and _answers(self.url)


@contextlib.contextmanager
def running_redis(workdir: Path) -> Iterator[str]:
    """Start redis-server, yield its URL, stop it."""
    server = RedisServer(workdir)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
