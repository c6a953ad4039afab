"""One engine (vLLM or a sim) as a bare process, for measurements that need no router."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from agent.engine_spec import EngineSpec


@contextlib.contextmanager
def running_engine(spec: EngineSpec, log_path: Path, ready_timeout_s: float = 600) -> Iterator[str]:
    """Start the engine, yield its base URL once /health answers, stop its process group."""
    url = f"http://{spec.host}:{spec.port}"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            spec.argv(), env=spec.env(dict(os.environ)), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not _healthy(url):
            if process.poll() is not None:
                raise RuntimeError(f"engine exited with {process.returncode}; see {log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine not ready after {ready_timeout_s:.0f}s; see {log_path}")
            time.sleep(0.5)
        yield url
    finally:
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=wait_s)
                break


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
