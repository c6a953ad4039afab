"""A local cluster as processes: one router, and one agent per worker, each agent running a vLLM.

``pdserve up``, the real-vLLM tests and the benchmarks all start clusters through
``LocalCluster``, so what the tests prove is what the launcher runs.

Process tree: caller -> router, and one agent per worker -> its vLLM. Each child
runs in its own session, so a terminal Ctrl-C reaches only the caller, which
stops the agents first (they drain and stop their engines) and the router last.
Nothing outlives ``stop()``: stragglers are SIGKILLed, descendants included; ``kill()``
does that at once. Nothing outlives the caller either: each child gets SIGTERM from
the kernel when its parent dies (``process_group``), so a caller killed outright
still takes the router, the agents and (through the agents) the engines with it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent import process_group
from agent.roles import agent_argv
from contracts.agent_tokens import agent_token
from localrun.hosts import LOOPBACK, Host
from localrun.ports import free_ports

Role = str  # "prefill" | "decode" | "colocated" | "embed"

# After this long without a worker ready, the progress lines quote what it last logged.
SLOW_START_S = 90.0


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionWorkers:
    """Colocated workers serving another registered version of the plan's model (a canary
    or a shadow), from their own folder; or embedding workers serving another version of
    the plan's embedding model."""

    version: str
    model_path: Path
    colocated: int = 1
    embed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterPlan:
    """What to start. Every field has the default ``pdserve up`` uses."""

    model_path: Path
    served_name: str
    # Colocated workers may serve under their own name, so that one router can
    # offer the same weights with and without P/D side by side (tests, benchmarks).
    colocated_served_name: str | None = None
    prefill: int = 1
    decode: int = 1
    colocated: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    run_dir: Path
    kv_cache_gib: int = 1
    max_model_len: int = 4096
    ready_timeout_s: float = 600.0
    heartbeat_interval_s: float = 2.0
    # In-flight requests get this long to finish on a stop. 20 s keeps the whole stop
    # (drain, engines, router) inside Kubernetes' default 30-s grace period.
    drain_timeout_s: float = 20.0
    kv_lease_s: int = 30  # how long producers hold unpulled KV (router's kv_lease_s <= this)
    engine: str = "vllm"  # or "sim": the simulator in vLLM's place
    sim_profile: str = "tiny-cpu"
    block_size: int | None = None  # None: the engine's default (vLLM CPU 128, sims their profile's)
    stream_interval: int | None = None  # tokens per streamed chunk; None: the engine's (1)
    # vLLM's --dtype for every engine; None: each agent chooses from its device
    # (agent.engine_dtype), as ``pdserve up`` does once and passes on.
    dtype: str | None = None
    # Engines publish KV events (ZMQ) that the router's prefix index subscribes to.
    kv_events: bool = True
    # Router replicas started elsewhere (sharing the state_url): agents fail over to them.
    extra_router_urls: tuple[str, ...] = ()
    # Extra router settings as PDSERVE_* environment variables.
    router_env: dict[str, str] = field(default_factory=dict)
    # The registered version the workers above report (None: outside the model registry),
    # and workers of other versions of the same model.
    model_version: str | None = None
    versions: tuple[VersionWorkers, ...] = ()
    # Embedding workers (vLLM's pooling runner) for an embedding model of their own.
    embed: int = 0
    embed_model_path: Path | None = None
    embed_served_name: str | None = None
    embed_version: str | None = None  # the registered version the embed workers report
    # Where each process runs, by name ("router", "prefill-0", ...): the multi-host tests
    # give each its own network namespace. One not named runs here: the router on
    # ``host``, a worker on loopback.
    hosts: Mapping[str, Host] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.prefill + self.decode + self.colocated + self.embed == 0:
            raise ValueError("nothing to start: give prefill/decode, colocated or embed workers")
        if self.embed and (self.embed_model_path is None or not self.embed_served_name):
            raise ValueError("embed workers need embed_model_path and embed_served_name")
        if (self.prefill == 0) != (self.decode == 0):
            raise ValueError("disaggregation needs both prefill and decode workers")


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    name: str
    role: Role
    served_name: str
    engine_port: int
    side_channel_port: int
    kv_events_port: int
    cores: str
    model_path: Path
    version: str | None = None
    host: Host = LOOPBACK

    @property
    def engine_url(self) -> str:
        return self.host.url(self.engine_port)


def plan_workers(plan: ClusterPlan, cpu_count: int) -> list[WorkerPlan]:
    """Ports and core binding: workers spread over cores; a lone worker gets all of them."""
    roles = ["prefill"] * plan.prefill + ["decode"] * plan.decode + ["colocated"] * plan.colocated
    sources = [(plan.model_path, plan.model_version)] * len(roles)
    for other in plan.versions:
        roles += ["colocated"] * other.colocated
        sources += [(other.model_path, other.version)] * other.colocated
    roles += ["embed"] * plan.embed
    sources += [(plan.embed_model_path, plan.embed_version)] * plan.embed
    for other in plan.versions:
        roles += ["embed"] * other.embed
        sources += [(other.model_path, other.version)] * other.embed
    ports = free_ports(3 * len(roles))
    workers = []
    for index, role in enumerate(roles):
        lone = len(roles) == 1 and cpu_count > 1
        cores = f"0-{cpu_count - 1}" if lone else str(index % cpu_count)
        served = plan.served_name
        if role == "colocated" and plan.colocated_served_name:
            served = plan.colocated_served_name
        model_path, version = sources[index]
        earlier = sum(1 for r, s in zip(roles[:index], sources, strict=False)
                      if r == role and s[1] == version)  # fmt: skip
        name = f"{role}-{earlier}"
        if role == "embed":
            served = plan.embed_served_name
            if version != plan.embed_version:
                name = f"{version}-{name}"
        elif version != plan.model_version:
            served, name = plan.served_name, f"{version}-{name}"
        engine_port, side_channel_port, events_port = ports[3 * index : 3 * index + 3]
        workers.append(WorkerPlan(
            name, role, served, engine_port, side_channel_port, events_port, cores,
            model_path, version, plan.hosts.get(name, LOOPBACK),
        ))  # fmt: skip
    return workers


class LocalCluster:
    def __init__(self, plan: ClusterPlan, *, say: Callable[[str], None] = print) -> None:
        self.plan = plan
        self.run_dir = plan.run_dir
        self.router_host = plan.hosts.get("router", Host(plan.host))
        self.router_url = self.router_host.url(plan.port)
        # The people's admin token (the router's and this launcher's), the secret agents'
        # tokens are minted from (the router's only), and the sims' fault endpoint's token:
        # no agent process holds the admin token or the secret. Hex, not urlsafe base64: a
        # token starting with "-" reads as a flag in `pdserve admin --token TOKEN`.
        self.admin_token = secrets.token_hex(24)
        self.agent_secret = secrets.token_hex(24)
        self.engine_token = secrets.token_hex(24)
        self.workers = plan_workers(plan, os.cpu_count() or 1)
        self.router: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}
        self._say = say
        self._killed = False

    def __repr__(self) -> str:
        return f"LocalCluster(router={self.router_url}, workers={[w.name for w in self.workers]})"

    def start(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Start everything and return once every worker is eligible for traffic."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._say(f"[1/3] router on {self.router_url}")
        self.router = self._spawn(
            "router",
            ["router", "--host", self.router_host.address, "--port", str(self.plan.port)],
            self.router_environment(),
            self.router_host,
        )
        process_group.wait_until(
            lambda: process_group.http_ok(self.router_url + "/health", timeout_s=1),
            timeout_s=120, what="router", process=self.router, stopping=stopping,
        )  # fmt: skip
        self._say(
            f"[2/3] {len(self.workers)} worker(s): "
            + ", ".join(f"{w.name}@{w.engine_port} cores {w.cores}" for w in self.workers)
        )
        for worker in self.workers:
            # In a file, as a Kubernetes init container hands it over: not in the
            # agent's environment, which its engine and anything it starts inherit.
            token_file = self.run_dir / f"{worker.name}.agent-token"
            write_private(token_file, agent_token(self.agent_secret, worker.name))
            self.agents[worker.name] = self._spawn(worker.name, self._agent_argv(worker), {
                "PDSERVE_AGENT_TOKEN_FILE": str(token_file),
                "PDSERVE_SIM_ADMIN_TOKEN": self.engine_token,
            }, worker.host)  # fmt: skip
        self._write_cluster_file()
        self._wait_ready(stopping)

    def start_replica(
        self, url: str, *, wait: bool = True, host: Host | None = None
    ) -> subprocess.Popen:
        """Start another router replica of this cluster at ``url`` (one of the plan's
        ``extra_router_urls``: the agents fail over to it), on ``host`` (default: here),
        and (``wait``) wait for it to answer. It shares the cluster's state only through
        the plan's ``PDSERVE_STATE_URL``; the caller stops it (``process_group.stop``)."""
        parts = urllib.parse.urlsplit(url)
        replica = self._spawn(
            f"router-{parts.port}",
            ["router", "--host", parts.hostname or self.plan.host, "--port", str(parts.port)],
            self.router_environment(),
            host or LOOPBACK,
        )
        if wait:
            process_group.wait_until(
                lambda: process_group.http_ok(url + "/health", timeout_s=1), timeout_s=120,
                what=f"router replica {url}", process=replica,
            )  # fmt: skip
        return replica

    def router_environment(self) -> dict[str, str]:
        """A router's: the run's files directory (``/v1/files``), the plan's settings, the
        secrets."""
        files = {"PDSERVE_FILES_DIR": str(self.run_dir / "files")}
        return {**files, **self.plan.router_env, **self.router_secrets()}

    def router_secrets(self) -> dict[str, str]:
        """What a router of this cluster (another replica too) needs: the admin token and
        the secret its agents' tokens come from."""
        return {"PDSERVE_ADMIN_TOKEN": self.admin_token, "PDSERVE_AGENT_SECRET": self.agent_secret}

    def _agent_argv(self, w: WorkerPlan) -> list[str]:
        p = self.plan
        pd = w.role in ("prefill", "decode")
        embed = w.role == "embed"  # its model's own context; no KV to publish
        return agent_argv(
            w.role, model=str(w.model_path), served_model_name=w.served_name,
            model_version=w.version,
            port=w.engine_port, router_url=",".join((self.router_url, *p.extra_router_urls)),
            worker_id=w.name, cores=w.cores, ready_file=self.ready_file(w.name),
            kv_cache_gib=p.kv_cache_gib, max_model_len=None if embed else p.max_model_len,
            ready_timeout_s=p.ready_timeout_s, heartbeat_interval_s=p.heartbeat_interval_s,
            drain_timeout_s=p.drain_timeout_s, engine=p.engine, sim_profile=p.sim_profile,
            log_file=self.run_dir / f"{w.name}.engine.log", block_size=p.block_size or None,
            stream_interval=p.stream_interval, dtype=p.dtype,
            host=w.host.address,
            # The events carry prompt token ids: published on the worker's own address only.
            kv_events_endpoint=(w.host.url(w.kv_events_port, "tcp")
                                if p.kv_events and not embed else None),
            side_channel_port=w.side_channel_port if pd else None,
            ucx_net_devices=w.host.interface if pd else None,
            ucx_tls=w.host.ucx_transports if pd else None,
            kv_lease_s=p.kv_lease_s if pd else None,
        )  # fmt: skip

    def _wait_ready(self, stopping: Callable[[], bool]) -> None:
        self._say("[3/3] waiting for vLLM to load weights (30-60 s per engine on CPU)")
        started = time.monotonic()
        next_report_s = started
        while not stopping():
            ready = self.ready_workers()
            if len(ready) == len(self.workers):
                self._say(f"      all {len(ready)} ready after {time.monotonic() - started:.0f}s")
                return
            if time.monotonic() >= next_report_s:
                waiting = [w.name for w in self.workers if w.name not in ready]
                elapsed_s = time.monotonic() - started
                self._say(f"      {elapsed_s:3.0f}s  waiting for {', '.join(waiting)}")
                if elapsed_s >= SLOW_START_S and round(elapsed_s) % 30 < 5:
                    # A worker this slow is stuck or starved: say what it last did.
                    for name in waiting:
                        self._say(f"            {name}: {self.last_log_line(name)}")
                next_report_s += 5
            if time.monotonic() - started > self.plan.ready_timeout_s:
                raise RuntimeError(
                    f"workers not ready after {self.plan.ready_timeout_s:.0f}s; "
                    f"see the logs in {self.run_dir}"
                )
            if not self.router_alive():
                raise RuntimeError(f"router exited; see {self.run_dir}/router.log")
            dead = [name for name, agent in self.agents.items() if agent.poll() is not None]
            if dead:
                raise RuntimeError(f"agent(s) {', '.join(dead)} exited; see {self.run_dir}")
            time.sleep(0.5)

    def admin(
        self, method: str, path: str, payload: dict | None = None, *, as_worker: str = ""
    ) -> dict:
        """Call the router's admin API with this cluster's admin token, or (``as_worker``)
        as that worker's agent."""
        token = agent_token(self.agent_secret, as_worker) if as_worker else self.admin_token
        request = urllib.request.Request(
            self.router_url + path,
            method=method,
            data=None if payload is None else json.dumps(payload).encode(),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)

    def worker_status(self) -> dict[str, dict]:
        """The router's view of each worker, by worker id."""
        try:
            workers = self.admin("GET", "/admin/workers")["workers"]
        except (OSError, ValueError):
            return {}
        return {w["worker_id"]: w for w in workers}

    def ready_workers(self) -> list[str]:
        return [wid for wid, w in self.worker_status().items() if w["eligible"]]

    def last_log_line(self, name: str) -> str:
        """The newest line a worker's engine (or else its agent) wrote, cut to 160 chars."""
        for path in (self.run_dir / f"{name}.engine.log", self.run_dir / f"{name}.log"):
            lines = _tail(path, 1)
            if lines:
                return lines[-1][:160]
        return "(no log yet)"

    def ready_file(self, name: str) -> Path:
        """The file a worker's agent keeps while the router takes it as ready."""
        return self.run_dir / f"{name}.ready"

    def worker(self, name: str) -> WorkerPlan:
        return next(w for w in self.workers if w.name == name)

    def router_alive(self) -> bool:
        return self.router is not None and self.router.poll() is None

    def stop(self) -> None:
        # Agents drain (bounded by drain_timeout_s) and stop their engines; then the router.
        # After kill(), no grace: anything started since dies at once.
        grace_s = 0.0 if self._killed else self.plan.drain_timeout_s + 30
        process_group.stop(list(self.agents.values()), grace_s=grace_s)
        if self.router is not None:
            process_group.stop([self.router], grace_s=0.0 if self._killed else 15)

    def kill(self) -> None:
        """Stop now, without draining: SIGKILL the router, the agents, their engines and
        everything those started. Safe to call from a signal handler, during ``stop()``."""
        self._killed = True
        router = [self.router] if self.router is not None else []
        process_group.kill_now([*self.agents.values(), *router])

    def _spawn(
        self, name: str, argv: list[str], extra_env: dict[str, str], host: Host
    ) -> subprocess.Popen:
        return process_group.spawn(
            [*host.run_prefix, sys.executable, "-m", "cli.main", *argv],
            env={**_without_secrets(os.environ), **extra_env},
            log_path=self.run_dir / f"{name}.log",
        )

    def _write_cluster_file(self) -> None:
        token_file = self.run_dir / "admin_token"
        write_private(token_file, self.admin_token)
        write_private(self.run_dir / "engine_token", self.engine_token)
        (self.run_dir / "cluster.json").write_text(json.dumps({
            "router_url": self.router_url,
            "model": self.plan.served_name,
            "model_path": str(self.plan.model_path),
            "launcher_pid": os.getpid(),
            "router_pid": self.router.pid if self.router else None,
            "admin_token_file": str(token_file),
            "workers": [
                dict(asdict(w), model_path=str(w.model_path), agent_pid=self.agents[w.name].pid)
                for w in self.workers
            ],
        }, indent=2))  # fmt: skip


def write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by its owner only, from the first byte: a temporary file
    created 0600, then renamed over ``path`` (never a moment at the umask's mode)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    os.replace(temporary, path)


def _without_secrets(environ: os._Environ[str] | dict[str, str]) -> dict[str, str]:
    """The launcher's environment less the tokens it must not pass on by accident (each
    process gets its own explicitly)."""
    secret = ("PDSERVE_ADMIN_TOKEN", "PDSERVE_ADMIN_TOKENS", "PDSERVE_AGENT_SECRET",
              "PDSERVE_AGENT_TOKEN")  # fmt: skip
    return {name: value for name, value in environ.items() if name not in secret}


def _tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` non-empty lines of a log, reading at most its last 64 KiB."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - 65536))
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]
