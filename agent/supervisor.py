"""Run one vLLM server as a child process: start, wait for ready, restart, stop.

Invariants:
- ``ready`` is true only between a successful readiness probe (weights loaded,
  ``/health`` and ``/v1/models`` answer) and the moment the process exits.
- The child runs in its own session, so stopping it kills vLLM's engine-core
  and worker processes too, never leaving orphans.
- The child dies with the agent: if the agent is killed outright, the kernel sends
  the engine SIGTERM (``process_group.PARENT_DEATH_SIGNAL``) and vLLM stops its own
  engine core. The event loop, which forks it, runs on the agent's main thread.
- Restarts back off exponentially up to ``max_backoff_s``; the backoff resets
  once an incarnation has stayed up for ``stable_after_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from agent import process_group
from agent.engine_spec import EngineSpec
from agent.placement import placement_violations
from agent.start_phases import log_offset

log = logging.getLogger("pdserve.agent")

StateCallback = Callable[[bool], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorPolicy:
    ready_timeout_s: float = 600.0
    probe_interval_s: float = 0.5
    min_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    stable_after_s: float = 60.0
    stop_grace_s: float = 15.0


class EngineSupervisor:
    def __init__(
        self,
        *,
        spec: EngineSpec,
        log_path: Path,
        on_state: StateCallback,
        policy: SupervisorPolicy = SupervisorPolicy(),
    ) -> None:
        self.spec = spec
        self.policy = policy
        self._log_path = log_path
        self._on_state = on_state
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = asyncio.Event()
        self.ready = False
        self.incarnation = 0
        # This incarnation's start: where its lines begin in the log, and the seconds
        # from spawning it to its answering (agent.start_phases reads both).
        self.log_from = -1
        self.start_s = 0.0

    def __repr__(self) -> str:
        return f"EngineSupervisor(port={self.spec.port}, ready={self.ready})"

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def run(self) -> None:
        """Keep an engine alive until ``stop`` is called."""
        backoff_s = self.policy.min_backoff_s
        while not self._stopping.is_set():
            started_s = time.monotonic()
            await self._run_once()
            if self._stopping.is_set():
                break
            if time.monotonic() - started_s > self.policy.stable_after_s:
                backoff_s = self.policy.min_backoff_s
            log.warning("engine on port %d exited; restarting in %.1fs", self.spec.port, backoff_s)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=backoff_s)
            backoff_s = min(backoff_s * 2, self.policy.max_backoff_s)

    async def _run_once(self) -> None:
        self.incarnation += 1
        self.log_from = log_offset(self._log_path)
        spawned_s = time.monotonic()
        self._process = await process_group.spawn_async(
            self.spec.argv(), env=self.spec.env(dict(os.environ)), log_path=self._log_path
        )
        log.info("engine started pid=%d port=%d", self._process.pid, self.spec.port)
        try:
            answering = await self._wait_ready()
            self.start_s = time.monotonic() - spawned_s
            if answering and await self._placed_as_assigned():
                self.ready = True
                await self._on_state(True)
                await self._process.wait()
        finally:
            was_ready, self.ready = self.ready, False
            self._kill_group(signal.SIGKILL)
            if was_ready:
                await self._on_state(False)

    async def _wait_ready(self) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + self.policy.ready_timeout_s
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < deadline:
                if self._process.returncode is not None or self._stopping.is_set():
                    return False
                if await _answers(session, f"{self.base_url}/health") and await _answers(
                    session, f"{self.base_url}/v1/models"
                ):
                    return True
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._process.wait(), self.policy.probe_interval_s)
        log.error(
            "engine on port %d not ready after %.0fs", self.spec.port, self.policy.ready_timeout_s
        )
        return False

    async def _placed_as_assigned(self) -> bool:
        """False (and a log line per stray thread) when any engine thread runs off its cores:
        such an engine is stopped and restarted, never registered."""
        expected = self.spec.expected_placement()
        if expected is None or self._process is None:
            return True
        problems = await asyncio.to_thread(placement_violations, self._process.pid, expected)
        for problem in problems:
            log.error("engine on port %d misplaced: %s", self.spec.port, problem)
        if problems:
            log.error(
                "engine on port %d: not registering it (%d thread(s) off their cores)",
                self.spec.port, len(problems),
            )  # fmt: skip
        return not problems

    async def stop(self) -> None:
        """Terminate the engine (SIGTERM, then SIGKILL after the grace period)."""
        self._stopping.set()
        process = self._process
        if process is None or process.returncode is not None:
            return
        self._kill_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=self.policy.stop_grace_s)
        except asyncio.TimeoutError:
            log.warning("engine pid=%d ignored SIGTERM; killing", process.pid)
        self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: signal.Signals) -> None:
        if self._process is not None:
            process_group.signal_group(self._process.pid, sig)


async def _answers(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url) as response:
            return response.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False
