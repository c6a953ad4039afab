"""``pdserve up``: a whole local cluster in one command, torn down by one Ctrl-C.

Process tree: this launcher -> router, and one agent per worker -> its vLLM.
Each child runs in its own session so a terminal Ctrl-C reaches only the
launcher, which then stops agents first (they drain and stop their engines)
and the router last. Nothing outlives it: stragglers are SIGKILLed by group.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from cli.model_prep import resolve
from cli.ports import free_ports


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    name: str
    role: str  # prefill | decode | colocated
    engine_port: int
    side_channel_port: int
    cores: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model folder")
    parser.add_argument("--prefill", type=int, default=1, help="prefill workers")
    parser.add_argument("--decode", type=int, default=1, help="decode workers")
    parser.add_argument("--colocated", type=int, default=0, help="colocated (no P/D) workers")
    parser.add_argument("--host", default="127.0.0.1", help="router bind address")
    parser.add_argument("--port", type=int, default=8000, help="router port")
    parser.add_argument(
        "--run-dir", default=None, help="logs and cluster.json (default .pdserve/runs/TS)"
    )
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)


def plan_workers(prefill: int, decode: int, colocated: int, cpu_count: int) -> list[WorkerPlan]:
    """Ports and core binding: workers spread over cores; a lone worker gets all of them."""
    roles = ["prefill"] * prefill + ["decode"] * decode + ["colocated"] * colocated
    ports = free_ports(2 * len(roles))
    plans = []
    for index, role in enumerate(roles):
        cores = (
            f"0-{cpu_count - 1}" if len(roles) == 1 and cpu_count > 1 else str(index % cpu_count)
        )
        count = roles[:index].count(role)
        plans.append(
            WorkerPlan(f"{role}-{count}", role, ports[2 * index], ports[2 * index + 1], cores)
        )
    return plans


def main(args: argparse.Namespace) -> int:
    if args.prefill + args.decode + args.colocated == 0:
        raise SystemExit("nothing to start: give --prefill/--decode or --colocated")
    if (args.prefill == 0) != (args.decode == 0):
        raise SystemExit("disaggregation needs both --prefill and --decode workers")
    run_dir = Path(args.run_dir or Path(".pdserve") / "runs" / time.strftime("%Y%m%d-%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    _say(f"run folder: {run_dir} (one log per process)")
    model_path, served_name = resolve(args.model)
    cluster = LocalCluster(args, run_dir, model_path, served_name)
    stop = {"signal": None}

    def request_stop(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        cluster.start(lambda: stop["signal"] is not None)
        if stop["signal"] is None:
            _say_ready(cluster.router_url, served_name)
        while stop["signal"] is None and cluster.router_alive():
            time.sleep(0.2)
        return 0 if stop["signal"] is not None else 1
    finally:
        _say("stopping: agents drain and stop their engines, then the router")
        cluster.stop()
        _say("stopped; no process left")


class LocalCluster:
    def __init__(self, args: argparse.Namespace, run_dir: Path, model: Path, served: str) -> None:
        self.args = args
        self.run_dir = run_dir
        self.model = model
        self.served = served
        self.router_url = f"http://{args.host}:{args.port}"
        self.token = secrets.token_urlsafe(24)
        self.workers = plan_workers(args.prefill, args.decode, args.colocated, os.cpu_count() or 1)
        self.router: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        env = dict(os.environ, PDSERVE_ADMIN_TOKEN=self.token)
        log = (self.run_dir / f"{name}.log").open("ab")
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def start(self, stopping: callable) -> None:
        _say(f"[1/3] router on {self.router_url}")
        self.router = self._spawn(
            "router", ["router", "--host", self.args.host, "--port", str(self.args.port)]
        )
        _wait_until(
            lambda: _http_ok(self.router_url + "/health"), 30, "router", stopping, self.router
        )
        _say(
            f"[2/3] {len(self.workers)} worker(s) for {self.served}: "
            + ", ".join(f"{w.name}@{w.engine_port} cores {w.cores}" for w in self.workers)
        )
        for w in self.workers:
            argv = [
                w.role, "--model", str(self.model), "--served-model-name", self.served,
                "--port", str(w.engine_port), "--router-url", self.router_url,
                "--worker-id", w.name, "--cores", w.cores,
                "--kv-cache-gib", str(self.args.kv_cache_gib),
                "--max-model-len", str(self.args.max_model_len),
                "--ready-timeout-s", str(self.args.ready_timeout_s),
                "--log-file", str(self.run_dir / f"{w.name}.engine.log"),
            ]  # fmt: skip
            if w.role != "colocated":
                argv += ["--side-channel-port", str(w.side_channel_port)]
            self.agents[w.name] = self._spawn(w.name, argv)
        self._write_cluster_file()
        _say("[3/3] waiting for vLLM to load weights (30-60 s per engine on CPU)")
        started = time.monotonic()
        next_report_s = started
        while not stopping():
            ready = self.ready_workers()
            if len(ready) == len(self.workers):
                _say(f"      all {len(ready)} ready after {time.monotonic() - started:.0f}s")
                return
            if time.monotonic() >= next_report_s:
                waiting = [w.name for w in self.workers if w.name not in ready]
                _say(f"      {time.monotonic() - started:3.0f}s  waiting for {', '.join(waiting)}")
                next_report_s += 5
            if time.monotonic() - started > self.args.ready_timeout_s:
                raise SystemExit(
                    f"workers not ready after {self.args.ready_timeout_s:.0f}s; see {self.run_dir}"
                )
            if not self.router_alive():
                raise SystemExit(f"router exited; see {self.run_dir}/router.log")
            time.sleep(0.5)

    def ready_workers(self) -> list[str]:
        request = urllib.request.Request(
            self.router_url + "/admin/workers", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                workers = json.load(response)["workers"]
        except (OSError, ValueError):
            return []
        return [w["worker_id"] for w in workers if w["eligible"]]

    def router_alive(self) -> bool:
        return self.router is not None and self.router.poll() is None

    def _write_cluster_file(self) -> None:
        token_file = self.run_dir / "admin_token"
        token_file.write_text(self.token)
        token_file.chmod(0o600)
        (self.run_dir / "cluster.json").write_text(json.dumps({
            "router_url": self.router_url,
            "model": self.served,
            "model_path": str(self.model),
            "launcher_pid": os.getpid(),
            "router_pid": self.router.pid if self.router else None,
            "admin_token_file": str(token_file),
            "workers": [dict(asdict(w), agent_pid=self.agents[w.name].pid) for w in self.workers],
        }, indent=2))  # fmt: skip

    def stop(self) -> None:
        for agent in self.agents.values():
            _signal_group(agent, signal.SIGTERM)
        # Agents drain (bounded by their --drain-timeout-s) and stop their engines.
        _wait_all(list(self.agents.values()), timeout_s=60)
        for agent in self.agents.values():
            _signal_group(agent, signal.SIGKILL)
        if self.router is not None:
            _signal_group(self.router, signal.SIGTERM)
            _wait_all([self.router], timeout_s=15)
            _signal_group(self.router, signal.SIGKILL)


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _wait_all(processes: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _wait_until(check, timeout_s: float, what: str, stopping, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if stopping():
            return
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with code {process.returncode}; see its log")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} not up after {timeout_s:.0f}s")
        time.sleep(0.2)


def _say(message: str) -> None:
    print(f"pdserve: {message}", flush=True)


def _say_ready(url: str, model: str) -> None:
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "stream": True,
    })  # fmt: skip
    _say(f"ready: OpenAI API at {url}/v1  (Ctrl-C stops everything)")
    print(
        f"\n  curl -N {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'\n",
        flush=True,
    )
