"""Child processes in their own session, so that one signal stops everything they started.

vLLM forks an engine core and workers; a signal to the API server's pid alone can leave
them holding the port, the cores and the KV cache. Every process pdserve starts (the
agent's engine, the launcher's router and agents, an engine measured bare) is started
here with ``start_new_session`` and stopped by process group: SIGTERM, a grace period,
then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def spawn(argv: Sequence[str], *, env: Mapping[str, str], log_path: Path) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, stdout and stderr appended to ``log_path``."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


async def spawn_async(
    argv: Sequence[str], *, env: Mapping[str, str], log_path: Path
) -> asyncio.subprocess.Process:
    """``spawn`` for an event loop."""
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *argv, env=dict(env), stdout=log, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the group ``pid`` leads; a group already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(processes: Sequence[subprocess.Popen], *, grace_s: float) -> None:
    """SIGTERM every group, wait up to ``grace_s`` for them all, then SIGKILL what is left."""
    for process in processes:
        signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        signal_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Does a GET of ``url`` answer 200 now?"""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def wait_until(
    check: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    process: subprocess.Popen,
    stopping: Callable[[], bool] = lambda: False,
    interval_s: float = 0.2,
) -> None:
    """Poll ``check`` until it holds; raise if ``process`` exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if stopping():
            return
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}; see its log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not up after {timeout_s:.0f}s; see its log")
        time.sleep(interval_s)
