"""A redis-server of our own on a free loopback port (tests and benchmarks; `make redis`).

No persistence, loopback only; the port survives ``stop()``/``start()``, so an outage can
be staged and ended.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from agent import process_group
from localrun.ports import free_ports


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
    except redis.exceptions.ConnectionError:
        return False


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make redis`")
        (self.port,) = free_ports(1)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", str(workdir)]  # fmt: skip
        self._process: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"RedisServer({self.url})"

    def start(self, timeout_s: float = 10) -> None:
        # It dies with its starter, as every process pdserve starts (agent.process_group).
        process = self._process = subprocess.Popen(
            self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            preexec_fn=process_group.die_with_parent(),
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while not _answers(self.port):
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
        return self._process is not None and _answers(self.port)


@contextlib.contextmanager
def running_redis(workdir: Path) -> Iterator[str]:
    """Start redis-server, yield its URL, stop it."""
    server = RedisServer(workdir)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
