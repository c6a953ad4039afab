"""What each fault scenario of ``benchmarks.faults`` injects, and on which cluster.

Each ``Scenario.inject`` does one injection and says in a few words what it did; the
suite then waits for the cluster to recover. The worker hit is one serving a request
at that moment when the scenario is about requests in flight (a kill mid-answer),
else the next in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import urllib.error
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from agent import process_group
from loadgen.prometheus_text import parse_text, total
from localrun.cluster import LocalCluster
from localrun.redis_server import RedisServer

FAULT_WINDOW_S = 3.0  # how long a toggled fault (transfers, events, an empty pool) lasts
# What the first router replica (never the one killed) counted, as (metric, label filter).
ROUTER_COUNTERS = {
    "stall_checks_alive": ("pdserve_stall_checks_total", {"outcome": "alive"}),
    "stall_checks_hung": ("pdserve_stall_checks_total", {"outcome": "hung"}),
    "migrations": ("pdserve_stream_migrations_total", {"outcome": "migrated"}),
    "kv_releases": ("pdserve_kv_releases_total", {"outcome": "released"}),
    "kv_releases_not_sent": ("pdserve_kv_releases_total", {"outcome": "no_consumer"}),
    "kv_releases_failed": ("pdserve_kv_releases_total", {"outcome": "failed"}),
    "circuit_trips": ("pdserve_worker_circuit_trips_total", {}),
}


class FaultTarget:
    """The cluster under test, as the scenarios reach it."""

    def __init__(self, cluster: LocalCluster, redis: RedisServer) -> None:
        self.cluster = cluster
        self.redis = redis
        self.replicas: dict[str, subprocess.Popen] = {}  # the extra router replicas, by URL
        self.kv_baseline: dict[str, float] = {}
        self._turns = itertools.count()

    async def status(self) -> dict[str, dict]:
        return await asyncio.to_thread(self.cluster.worker_status)

    async def whole(self) -> bool:
        """Every worker registered, in rotation, with a live engine (the router may not
        have noticed a killed one yet); every router replica and Redis up."""
        workers = await self.status()
        if not self.redis.running:
            return False
        for url in self.replicas:
            if not await asyncio.to_thread(process_group.http_ok, url + "/health", 1):
                return False
        return len(workers) == len(self.cluster.workers) and all(
            w["eligible"] and _alive(w["engine_pid"]) for w in workers.values()
        )

    async def router_counters(self) -> dict[str, float]:
        """``ROUTER_COUNTERS`` as the first router replica has them now."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.cluster.router_url + "/metrics") as response,
        ):
            samples = parse_text(await response.text())
        return {key: total(samples, name, **labels)
                for key, (name, labels) in ROUTER_COUNTERS.items()}  # fmt: skip

    async def restart_replica(self, url: str, signum: signal.Signals) -> None:
        """Signal a router replica's process group, wait for it to die, start it again
        (``whole`` waits for it to answer)."""
        replica = self.replicas[url]
        process_group.signal_group(replica.pid, signum)
        await asyncio.to_thread(replica.wait, 30)
        # Spawned here, on the main thread: a child started from a worker thread would
        # die with that thread (process_group.die_with_parent).
        self.replicas[url] = self.cluster.start_replica(url, wait=False)

    def names(self, role: str) -> list[str]:
        return [w.name for w in self.cluster.workers if w.role == role]

    async def kv_usage(self) -> dict[str, float]:
        """Each engine's own KV usage (0..1), from its /metrics."""
        usage = {}
        async with aiohttp.ClientSession() as session:
            for worker in self.cluster.workers:
                used = await _engine_gauge(session, worker.engine_url, "vllm:kv_cache_usage_perc")
                if used is not None:
                    usage[worker.name] = used
        return usage

    async def learn_kv_baseline(self) -> None:
        self.kv_baseline = await self.kv_usage()

    async def busy(self, role: str, within_s: float = 5.0) -> str:
        """A worker of ``role`` with a request running, else the next in turn."""
        names = self.names(role)
        deadline = asyncio.get_running_loop().time() + within_s
        async with aiohttp.ClientSession() as session:
            while asyncio.get_running_loop().time() < deadline:
                for name in names:
                    url = self.cluster.worker(name).engine_url
                    if (await _engine_gauge(session, url, "vllm:num_requests_running") or 0) > 0:
                        return name
                await asyncio.sleep(0.05)
        return names[next(self._turns) % len(names)]

    async def signal_engine(self, name: str, signum: signal.Signals) -> int:
        pid = (await self.status())[name]["engine_pid"]
        os.kill(pid, signum)
        return pid

    async def gone(self, pid: int, within_s: float = 60.0) -> bool:
        """Wait for a signalled engine to be dead, so recovery is timed from its death."""
        deadline = asyncio.get_running_loop().time() + within_s
        while asyncio.get_running_loop().time() < deadline:
            if not _alive(pid):
                return True
            await asyncio.sleep(0.02)
        return False

    async def admin(self, method: str, path: str, payload: dict | None = None) -> dict:
        return await asyncio.to_thread(self.cluster.admin, method, path, payload)

    async def sim_faults(self, name: str, **faults: object) -> None:
        headers = {"Authorization": f"Bearer {self.cluster.engine_token}"}
        url = self.cluster.worker(name).engine_url + "/sim/faults"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=faults, headers=headers) as response,
        ):
            response.raise_for_status()

    async def ejected(self, name: str, within_s: float) -> bool:
        deadline = asyncio.get_running_loop().time() + within_s
        while asyncio.get_running_loop().time() < deadline:
            if not (await self.status()).get(name, {}).get("eligible", True):
                return True
            await asyncio.sleep(0.2)
        return False


async def _engine_gauge(session: aiohttp.ClientSession, engine_url: str, name: str) -> float | None:
    """One of an engine's own metrics, or None when its /metrics cannot be read."""
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        async with session.get(engine_url + "/metrics") as response:
            return total(parse_text(await response.text()), name)
    return None


def _alive(pid: int | None) -> bool:
    """A running process, not a zombie its agent has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


Inject = Callable[[FaultTarget], Awaitable[str]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    inject: Inject
    engines: tuple[str, ...] = ("sim", "vllm")
    gap_s: float = 1.0  # after the cluster recovered, before the next injection
    replicas: int = 1  # router replicas it needs
    cuts_allowed: bool = False  # a killed router's clients see their connection break


def _kill(role: str, signum: signal.Signals) -> Inject:
    async def inject(target: FaultTarget) -> str:
        name = await target.busy(role)
        died = await target.gone(await target.signal_engine(name, signum))
        return f"{signum.name} {name}" + ("" if died else " (alive 60 s later)")

    return inject


async def _hang_decode(target: FaultTarget) -> str:
    name = await target.busy("decode")
    await target.signal_engine(name, signal.SIGSTOP)
    try:
        ejected = await target.ejected(name, within_s=60)
    finally:
        await target.signal_engine(name, signal.SIGCONT)
    return f"SIGSTOP {name} until {'ejected' if ejected else 'a 60 s limit'}, then SIGCONT"


def _sim_fault(role: str, **faults: float) -> Inject:
    async def inject(target: FaultTarget) -> str:
        names = target.names(role)
        for name in names:
            await target.sim_faults(name, **faults)
        await asyncio.sleep(FAULT_WINDOW_S)
        for name in names:
            await target.sim_faults(name, **dict.fromkeys(faults, 0.0))
        return f"{faults} on {', '.join(names)} for {FAULT_WINDOW_S:.0f} s"

    return inject


def _empty_pool(role: str) -> Inject:
    async def inject(target: FaultTarget) -> str:
        names = target.names(role)
        for name in names:
            await target.admin("POST", f"/admin/v1/workers/{name}/drain")
        await asyncio.sleep(FAULT_WINDOW_S)
        for name in names:
            await target.admin("POST", f"/admin/v1/workers/{name}/undrain")
        return f"drained every {role} worker for {FAULT_WINDOW_S:.0f} s"

    return inject


async def _kill_router(target: FaultTarget) -> str:
    """SIGKILL the second router replica under load and start it again, as a supervisor
    would: its clients' requests in flight break; the other replica's go on."""
    url = next(iter(target.replicas))
    await target.restart_replica(url, signal.SIGKILL)
    return f"SIGKILL the router replica at {url}, then start it again"


async def _kill_redis(target: FaultTarget) -> str:
    """SIGKILL redis-server for FAULT_WINDOW_S, ask for a config change meanwhile (it must
    be refused with a clear 503), then start it again, empty (no persistence)."""
    model = target.cluster.plan.served_name
    plan = target.cluster.plan
    target.redis.kill()
    try:
        await asyncio.sleep(FAULT_WINDOW_S / 2)
        change = {"prefill": plan.prefill, "decode": plan.decode}
        try:
            await target.admin("PUT", f"/admin/v1/pools/{model}", change)
            answer = "accepted"
        except urllib.error.HTTPError as error:
            code = json.loads(error.read() or b"{}").get("error", {}).get("code")
            answer = f"{error.code} {code}"
        await asyncio.sleep(FAULT_WINDOW_S / 2)
    finally:
        target.redis.start()  # on the main thread (die_with_parent); it answers in ~50 ms
    return (
        f"SIGKILL redis-server for {FAULT_WINDOW_S:.0f} s (a config change meanwhile: "
        f"{answer}), then start it again, empty"
    )


async def _re_role(target: FaultTarget) -> str:
    """Move one worker across the P:D line through the ratio API, and wait for it; the
    next injection moves it back (an even count ends where it started)."""
    model = target.cluster.plan.served_name
    counts = (await target.admin("GET", "/admin/v1/pools"))["models"][model]["counts"]
    start = (counts["prefill"], counts["decode"])
    base = (target.cluster.plan.prefill, target.cluster.plan.decode)
    want = (base[0] + 1, base[1] - 1) if start == base else base
    change = {"prefill": want[0], "decode": want[1]}
    operation = await target.admin("PUT", f"/admin/v1/pools/{model}", change)
    status = {"status": "running"}
    while status["status"] == "running":
        await asyncio.sleep(0.25)
        status = await target.admin("GET", operation["status_url"])
    return f"P:D {start[0]}:{start[1]} -> {want[0]}:{want[1]}, {status['status']}"


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("kill_prefill", "SIGKILL a prefill engine with a request on it (before or "
                 "after its handoff)", _kill("prefill", signal.SIGKILL)),
        Scenario("kill_decode", "SIGKILL a decode engine mid-stream",
                 _kill("decode", signal.SIGKILL)),
        Scenario("sigterm_decode", "SIGTERM a decode engine mid-stream (it aborts what runs)",
                 _kill("decode", signal.SIGTERM)),
        Scenario("hang_decode", "SIGSTOP a decode engine mid-stream until the router ejects "
                 "it", _hang_decode),
        Scenario("fail_kv_transfer", "every KV pull by the decode workers fails (the sim "
                 "answers 500, as vLLM's kv_load_failure_policy=fail does; under the shipped "
                 "recompute policy vLLM answers 200 and the producer holds the blocks until "
                 "the lease)",
                 _sim_fault("decode", transfer_failure_probability=1.0), engines=("sim",)),
        Scenario("kv_event_gap", "the prefill engines' KV events are dropped",
                 _sim_fault("prefill", kv_event_drop_probability=1.0), engines=("sim",)),
        Scenario("kill_router", "SIGKILL a router replica under load, then restart it",
                 _kill_router, replicas=2, cuts_allowed=True),
        Scenario("kill_redis", "SIGKILL redis-server for 3 s, then restart it empty",
                 _kill_redis),
        Scenario("empty_prefill_pool", "every prefill worker drained",
                 _empty_pool("prefill")),
        Scenario("empty_decode_pool", "every decode worker drained", _empty_pool("decode")),
        # Last: the workers' roles are not the plan's while it runs.
        Scenario("re_role", "the ratio API moves a decode worker to prefill, or back",
                 _re_role),
    )
}  # fmt: skip
