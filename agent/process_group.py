"""Child processes in their own session, tied to their parent's life, stopped by group.

vLLM forks an engine core and workers; a signal to the API server's pid alone can leave
them holding the port, the cores and the KV cache. Every process pdserve starts (the
agent's engine, the launcher's router and agents, an engine measured bare) is started
here with ``start_new_session`` and stopped by process group: SIGTERM, a grace period,
then SIGKILL of the whole tree.

A session of its own also puts the child out of reach of a signal to its parent's
group, so each child asks the kernel for a signal when its parent dies
(``PR_SET_PDEATHSIG``): a parent killed outright (SIGKILL, the OOM killer, a harness's
group kill) takes its children with it, and they take theirs. The signal is SIGTERM,
so that each child stops what it started the way it always does (the agent its
engine's group, vLLM its engine core, uvicorn its workers); SIGKILL would leave those
grandchildren behind. The kernel sends it when the *thread* that forked the child
exits, so children are forked from the main thread only, which lives as long as the
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent.placement import process_tree

# The signal a child gets when its parent dies (see the module's docstring).
PARENT_DEATH_SIGNAL = signal.SIGTERM
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def spawn(argv: Sequence[str], *, env: Mapping[str, str], log_path: Path) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, stdout and stderr appended to ``log_path``;
    it gets ``PARENT_DEATH_SIGNAL`` if this process dies first."""
    preexec = die_with_parent()
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec,
        )  # fmt: skip


async def spawn_async(
    argv: Sequence[str], *, env: Mapping[str, str], log_path: Path
) -> asyncio.subprocess.Process:
    """``spawn`` for an event loop (which must run on the main thread)."""
    preexec = die_with_parent()
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *argv, env=dict(env), stdout=log, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec,
        )  # fmt: skip


def die_with_parent(sig: signal.Signals = PARENT_DEATH_SIGNAL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send ``sig`` to the child when this process
    dies (Linux; None elsewhere). Call it on the thread that forks, the main thread."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        # The kernel signals the child when the forking thread exits, not the process.
        raise RuntimeError("start child processes from the main thread: a child tied to "
                           "another thread would be killed when that thread ends")  # fmt: skip
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent_pid = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:  # the parent died before the request took hold
            os._exit(128 + int(sig))

    return preexec


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the group ``pid`` leads; a group already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(processes: Sequence[subprocess.Popen], *, grace_s: float) -> None:
    """SIGTERM every group, wait up to ``grace_s`` for them all, then SIGKILL what is left
    (``kill_now``)."""
    for process in processes:
        signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    kill_now(processes)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def kill_now(processes: Sequence[subprocess.Popen]) -> None:
    """SIGKILL each process's group and every descendant, whatever their session (an
    agent's engine and vLLM's engine core are in sessions of their own). Safe in a
    signal handler: it reads ``returncode`` and never waits."""
    alive = [process.pid for process in processes if process.returncode is None]
    tree = {pid for root in alive for pid in process_tree(root)}  # before anything dies
    for process in processes:
        signal_group(process.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


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
