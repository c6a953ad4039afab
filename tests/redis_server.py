"""A real redis-server on a free loopback port, for the state tests (``make redis`` installs it)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import redis

from localrun.ports import free_ports
from tests.conditions import wait_for


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
    except redis.exceptions.ConnectionError:
        return False


@contextlib.contextmanager
def running_redis(workdir: Path) -> Iterator[str]:
    """Start redis-server (no persistence, loopback only), yield its URL, stop it."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run `make redis`")
    (port,) = free_ports(1)
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(lambda: _answers(port) or process.poll() is not None, 10, "redis-server")
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)
