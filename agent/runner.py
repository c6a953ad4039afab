"""The agent's lifecycle: supervise the engine, report to the router, drain on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.engine_dtype import DTYPE_ENV, DTYPES, DtypeChoice, choose_dtype
from agent.engine_spec import EngineSpec, detect_device
from agent.log_echo import echo_log
from agent.prefill_probe import ProbePlan, measure_prefill
from agent.prepull import Prepuller
from agent.reporter import RouterReporter
from agent.start_phases import start_phases
from agent.supervisor import EngineSupervisor, SupervisorPolicy
from contracts.agent_tokens import token_worker
from contracts.block_hashing import engine_hash_seed
from contracts.logs import configure_logging
from contracts.machine import read_cpu
from contracts.workers import WorkerRegistration, WorkerRole
from modelstore.checksum import folder_checksum

log = logging.getLogger("pdserve.agent")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every worker role shares."""
    parser.add_argument("--model", required=True, help="model folder to serve")
    parser.add_argument("--served-model-name", required=True, help="model name clients use")
    parser.add_argument("--model-version", default=None,
                        help="the registered version this folder is (the router's model "
                        "registry); the router routes by it")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="engine bind address")
    parser.add_argument("--port", type=int, required=True, help="engine HTTP port")
    parser.add_argument("--router-url", required=True,
                        help="router base URL to register with; several replicas "
                        "comma-separated (they must share --state-url)")  # fmt: skip
    parser.add_argument(
        "--worker-id", default=None, help="default: the worker PDSERVE_AGENT_TOKEN names"
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--cores", default=None, help='CPU cores to bind ("0", "0-1") or GPUs')
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="CPU KV cache size")
    parser.add_argument("--engine-idle-spin-s", type=float, default=None,
                        help="how long vLLM's workers busy-wait for the next step before "
                        "sleeping (default: 0.02 on CPU, where a longer spin takes the engine's "
                        "own cores; vLLM's 1 s on CUDA)")  # fmt: skip
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help=f"vLLM's --dtype (default: ${DTYPE_ENV}, else chosen from the "
                        "device: float32 on a CPU without native bf16, bfloat16 on one with "
                        "it, the model's own on GPU)")  # fmt: skip
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--kv-events-endpoint", default=None, help="ZMQ endpoint for KV events")
    parser.add_argument("--prefix-caching-hash-algo", default="sha256",
                        choices=["sha256", "sha256_cbor"])  # fmt: skip
    parser.add_argument("--stream-interval", type=int, default=None,
                        help="output tokens per streamed chunk (vLLM's flag; default 1): more "
                        "costs less CPU per token and streams in bursts")  # fmt: skip
    parser.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="priority",
                        help="vLLM's flag: priority (the default) lets the router's classes "
                        "order the engine's waiting requests (batch lines last)")  # fmt: skip
    parser.add_argument("--engine", choices=["vllm", "sim"], default="vllm",
                        help="vllm, or pdserve's simulator in its place")  # fmt: skip
    parser.add_argument("--sim-profile", default="tiny-cpu", help="timing profile for --engine sim")
    parser.add_argument("--log-file", default=None, help="engine log (default: next to cwd)")
    parser.add_argument("--echo-engine-log", action="store_true",
                        help="copy the engine log to this agent's stdout as it grows, and "
                        "empty it past 64 MiB: in a pod, `kubectl logs` shows the engine "
                        "while the agent still reads vLLM's start-up figures from the "
                        "file")  # fmt: skip
    parser.add_argument("--heartbeat-interval-s", type=float, default=2.0)
    parser.add_argument("--drain-timeout-s", type=float, default=30.0)
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    parser.add_argument("--ready-file", type=Path, default=None,
                        help="a file that exists exactly while the router takes this worker "
                        "as ready (weights loaded, registered, not draining): a Kubernetes "
                        "readiness probe's `test -f`")  # fmt: skip
    parser.add_argument("--prefill-probe-budget-s", type=float, default=10.0,
                        help="seconds the prefill-rate probe may take before the worker "
                        "registers (its sizes shrink to fit; agent/prefill_probe.py)")  # fmt: skip
    parser.add_argument("engine_args", nargs=argparse.REMAINDER, help="-- then extra vLLM args")


def engine_dtype(args: argparse.Namespace, device: str) -> DtypeChoice:
    """The flag, else ``$PDSERVE_DTYPE``, else what this device computes natively."""
    if args.engine == "sim":
        return DtypeChoice("auto", "a simulated engine computes nothing")
    try:
        return choose_dtype(
            device=device, cpu=read_cpu(), requested=args.dtype, setting=os.environ.get(DTYPE_ENV)
        )
    except ValueError as error:
        raise SystemExit(f"pdserve agent: {error}") from None


def base_spec_fields(args: argparse.Namespace) -> dict:
    extra = [a for a in args.engine_args if a != "--"]
    device = detect_device() if args.device == "auto" else args.device
    dtype = engine_dtype(args, device)
    return {
        "model_path": args.model,
        "served_model_name": args.served_model_name,
        "model_version": args.model_version,
        "host": args.host,
        "port": args.port,
        "device": device,
        "dtype": dtype.dtype,
        "cores": args.cores,
        "kv_cache_gib": args.kv_cache_gib,
        "max_model_len": args.max_model_len,
        "block_size": args.block_size,
        "kv_events_endpoint": args.kv_events_endpoint,
        "idle_spin_s": args.engine_idle_spin_s,
        "prefix_caching_hash_algo": args.prefix_caching_hash_algo,
        "stream_interval": args.stream_interval,
        "scheduling_policy": args.scheduling_policy,
        "extra_args": tuple(extra),
        "engine": args.engine,
        "sim_profile": args.sim_profile,
        # Set by the command line for --engine sim (the agent does not import the sim).
        "sim_facts": getattr(args, "sim_facts", None),
    }


def run_agent(
    role: WorkerRole,
    spec: EngineSpec,
    args: argparse.Namespace,
    respec: Callable[[WorkerRole], EngineSpec] | None = None,
) -> int:
    """Serve ``role`` until SIGTERM; with ``respec``, switch roles when the router asks."""
    token = _agent_token()
    named = token_worker(token)
    if named is None:
        raise SystemExit(
            "PDSERVE_AGENT_TOKEN (or a file PDSERVE_AGENT_TOKEN_FILE names) must hold this "
            "worker's agent token: `PDSERVE_AGENT_SECRET=... pdserve agent-token WORKER_ID` "
            "mints it"
        )
    worker_id = args.worker_id or named
    if worker_id != named:
        raise SystemExit(f"PDSERVE_AGENT_TOKEN is for worker {named!r}, not {worker_id!r}")
    configure_logging(role.value)
    log.info("engine %s", engine_dtype(args, spec.device).line())
    log_path = Path(args.log_file or f"{worker_id}.engine.log")
    agent = _Agent(worker_id=worker_id, args=args, token=token, log_path=log_path, respec=respec)
    asyncio.run(agent.serve(role, spec))
    return 0


def _agent_token() -> str:
    """From the environment, or a file (a Kubernetes init container mints it there, so
    the agent's own container never holds the secret it is minted from)."""
    token = os.environ.get("PDSERVE_AGENT_TOKEN", "")
    path = os.environ.get("PDSERVE_AGENT_TOKEN_FILE", "")
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as error:
            raise SystemExit(f"PDSERVE_AGENT_TOKEN_FILE: {error}") from None
    return token


def _registration(worker_id: str, role: WorkerRole, spec: EngineSpec) -> WorkerRegistration:
    return WorkerRegistration(
        worker_id=worker_id,
        role=role,
        model=spec.served_model_name,
        model_version=spec.model_version,
        model_checksum=_checksum(spec),
        engine_url=f"http://{spec.host}:{spec.port}",
        kv_events_endpoint=spec.kv_events_subscribe_endpoint(),
        block_size=spec.resolved_block_size(),
        prefix_caching_hash_algo=spec.prefix_caching_hash_algo,
        prefix_hash_seed=engine_hash_seed(spec.env(dict(os.environ))),
        tokenizer_path=str(Path(spec.model_path).resolve()),
        kv_capacity_tokens=spec.kv_capacity_tokens(),
        max_model_len=spec.context_window(),
        accelerator=spec.accelerator(),
        scheduling_policy=spec.scheduling_policy,
    )


# The roles that prefill a request's prompt: the router predicts their TTFT.
_FIRST_HOP = (WorkerRole.PREFILL, WorkerRole.COLOCATED)


@functools.cache
def _checksum_of(folder: str) -> str | None:
    try:
        return folder_checksum(Path(folder))
    except OSError as error:
        log.warning("cannot checksum %s: %s", folder, error)
        return None


def _checksum(spec: EngineSpec) -> str | None:
    """With a registered version, what the router checks against the registry: read once
    per agent (the engine reads the same files, so they are in the page cache)."""
    return _checksum_of(spec.model_path) if spec.model_version else None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Agent:
    worker_id: str
    args: argparse.Namespace
    token: str
    log_path: Path
    respec: Callable[[WorkerRole], EngineSpec] | None

    async def serve(self, role: WorkerRole, spec: EngineSpec) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        prepuller = Prepuller(Path(spec.model_path))
        echo = None
        if self.args.echo_engine_log:
            echo = asyncio.create_task(echo_log(self.log_path, sys.stdout.buffer))
        try:
            await self._report_and_serve(role, spec, stop, prepuller)
        finally:
            if echo is not None:
                echo.cancel()

    async def _report_and_serve(
        self, role: WorkerRole, spec: EngineSpec, stop: asyncio.Event, prepuller: Prepuller
    ) -> None:
        async with RouterReporter(
            router_url=self.args.router_url,
            agent_token=self.token,
            registration=_registration(self.worker_id, role, spec),
            engine_url=f"http://{spec.host}:{spec.port}",
            interval_s=self.args.heartbeat_interval_s,
            ready_file=self.args.ready_file,
            pulled_versions=prepuller.versions,
            on_pull_order=prepuller.order,
        ) as reporter:
            incarnation = 0
            while True:
                incarnation = await self._serve_role(spec, reporter, stop, incarnation)
                wanted = reporter.wanted_role
                if stop.is_set() or wanted is None or self.respec is None:
                    await reporter.beat()
                    return
                log.info("re-roling %s: %s -> %s", self.worker_id, role.value, wanted.value)
                role, spec = wanted, self.respec(wanted)
                reporter.become(_registration(self.worker_id, role, spec))

    async def _serve_role(
        self, spec: EngineSpec, reporter: RouterReporter, stop: asyncio.Event, incarnation: int
    ) -> int:
        """Run the engine until SIGTERM or a new role is asked for; drain; stop it.
        Returns the last incarnation, so the next engine's is newer."""
        supervisor: EngineSupervisor

        async def on_state(ready: bool) -> None:
            probed_s = time.monotonic()
            if ready and reporter.registration.role in _FIRST_HOP:
                probe = await measure_prefill(
                    f"http://{spec.host}:{spec.port}", spec.served_model_name,
                    max_model_len=spec.context_window(),
                    plan=ProbePlan(budget_s=self.args.prefill_probe_budget_s),
                )  # fmt: skip
                reporter.registration = reporter.registration.model_copy(
                    update={"prefill_probe": probe}
                )
            if ready:
                phases = start_phases(
                    model_path=Path(spec.model_path), log_path=self.log_path,
                    log_from=supervisor.log_from, engine_start_s=supervisor.start_s,
                    probe_s=time.monotonic() - probed_s,
                )  # fmt: skip
                log.info("engine start: %s", ", ".join(f"{k} {v:.1f}s" for k, v in phases.items()))
                reporter.registration = reporter.registration.model_copy(
                    update={"start_phases": phases}
                )
            await reporter.set_ready(
                ready, engine_pid=supervisor.pid, incarnation=supervisor.incarnation
            )

        supervisor = EngineSupervisor(
            spec=spec,
            log_path=self.log_path,
            on_state=on_state,
            policy=SupervisorPolicy(ready_timeout_s=self.args.ready_timeout_s),
        )
        supervisor.incarnation = incarnation
        tasks = [asyncio.create_task(supervisor.run()), asyncio.create_task(reporter.run())]
        waits = [asyncio.create_task(stop.wait()), asyncio.create_task(reporter.role_wanted.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        why = "SIGTERM" if stop.is_set() else "re-role"
        log.info("%s: draining %s", why, self.worker_id)
        await reporter.set_draining()
        await _drain(reporter, self.args.drain_timeout_s)
        await supervisor.stop()
        for task in [*tasks, *waits]:
            task.cancel()
        for task in [*tasks, *waits]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return supervisor.incarnation


async def _drain(reporter: RouterReporter, timeout_s: float) -> None:
    """Wait for in-flight requests to finish, up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while reporter.ready and time.monotonic() < deadline:
        if await reporter.engine_idle():
            return
        await asyncio.sleep(0.5)
