"""A real router process on a free port, with no engine behind it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from contracts.agent_tokens import agent_token
from localrun.ports import free_ports

ADMIN_TOKEN = "test-admin-token"
AGENT_SECRET = "test-agent-secret"


@dataclass(frozen=True)
class RouterProcess:
    url: str

    def admin(self, method: str, path: str, json: dict | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        return httpx.request(method, self.url + path, json=json, headers=headers, timeout=10)

    def agent(self, method: str, path: str, json: dict | None = None) -> httpx.Response:
        """Call as the agent of the worker named in the body (or, with none, the path)."""
        worker_id = json["worker_id"] if json else path.rsplit("/", 1)[-1]
        headers = {"Authorization": f"Bearer {agent_token(AGENT_SECRET, worker_id)}"}
        return httpx.request(method, self.url + path, json=json, headers=headers, timeout=10)

    def register(self, worker_id: str, role: str, model: str, engine_url: str) -> None:
        worker = {"worker_id": worker_id, "role": role, "model": model, "engine_url": engine_url}
        assert self.agent("POST", "/admin/workers/register", worker).status_code == 200


@contextlib.contextmanager
def running_router(**settings: str) -> Iterator[RouterProcess]:
    """A router process with these PDSERVE_* settings, up until the block ends."""
    (port,) = free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDSERVE_")}
    env.update(settings)
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "router", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()  # a live process's stderr would never reach EOF
            process.wait()
            raise RuntimeError(f"router did not start: {process.stderr.read().decode()[-2000:]}")
        time.sleep(0.1)
    try:
        yield RouterProcess(url)
    finally:
        process.terminate()
        process.wait(timeout=15)


TEST_ROUTER = {
    "PDSERVE_ADMIN_TOKEN": ADMIN_TOKEN,
    "PDSERVE_AGENT_SECRET": AGENT_SECRET,
    "PDSERVE_MAX_BODY_BYTES": "65536",
    # The router's own probe would take dead test workers out of rotation mid-test.
    "PDSERVE_HEALTH_INTERVAL_S": "3600",
}


@pytest.fixture(scope="session")
def router() -> Iterator[RouterProcess]:
    with running_router(**TEST_ROUTER) as process:
        yield process


@pytest.fixture(scope="session")
def strict_router() -> Iterator[RouterProcess]:
    """``serve_degraded`` off: a P/D model is served only while both its pools are ready."""
    with running_router(**TEST_ROUTER, PDSERVE_SERVE_DEGRADED="false") as process:
        yield process
