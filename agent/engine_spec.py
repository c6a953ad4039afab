"""The description of one vLLM server, and the argv/env that start it.

On CPU, vLLM reads its KV size and core binding from the environment
(``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_CPU_OMP_THREADS_BIND``); on CUDA the same
knobs are ``--gpu-memory-utilization`` and ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agent.engine_dtype import Dtype, dtype_bytes
from agent.engine_memory import accelerator_name
from agent.placement import ExpectedPlacement, parse_cpu_list
from contracts.workers import SchedulingPolicy
from kvtransfer.transport import NixlTransport

Device = Literal["cpu", "cuda"]
# vLLM's default --block-size per platform; pdserve always passes one explicitly so
# that the router hashes prompts with the block size the engine really uses.
DEFAULT_BLOCK_SIZE: dict[str, int] = {"cpu": 128, "cuda": 16}
EngineKind = Literal["vllm", "sim"]
# Long enough to span the gap between two decode steps (~10 ms on CPU), so a running
# request never takes the sleeping path; short enough that an idle engine frees its core.
CPU_IDLE_SPIN_S = 0.02
# Its sitecustomize runs first in every engine interpreter: core pinning, NIXL fixes.
ENGINE_SITE_DIR = Path(__file__).with_name("engine_site")


def detect_device() -> Device:
    """CUDA when an NVIDIA driver is present, else the vLLM CPU build."""
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimFacts:
    """What the agent must know of a simulated engine: read from the sim's timing profile
    at the edge (``localrun.sim_engine``), so that the agent never imports the sim."""

    block_size_tokens: int
    kv_capacity_tokens: int
    max_model_len: int
    accelerator: str = "cpu"  # what the profile models, priced as such by the cost model


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSpec:
    model_path: str
    served_model_name: str
    # The registered version (router's model registry) this model folder is; None: none.
    model_version: str | None = None
    host: str = "127.0.0.1"
    port: int
    device: Device = "cpu"
    # CPU: an OMP bind list like "0" or "0-1". CUDA: CUDA_VISIBLE_DEVICES.
    cores: str | None = None
    kv_cache_gib: int = 1  # vLLM's CPU build reads whole GiB only
    gpu_memory_utilization: float = 0.85
    max_model_len: int | None = None
    block_size: int | None = None
    # vLLM's --dtype: "auto" keeps the checkpoint's. The agent resolves it from the CPU
    # (agent.engine_dtype): float32 where bf16 is not native, where bf16 is 5x slower.
    dtype: Dtype = "auto"
    # Compilation made startup 2-3x slower on CPU for ~10% speed, and its cache
    # did not survive restarts; eager is the sane default there.
    enforce_eager: bool | None = None
    kv_events_endpoint: str | None = None
    # How long vLLM's workers busy-wait for the next step before they sleep. vLLM
    # spins 1 s; on CPU the spin takes the cores the engine itself computes on
    # (docs/pd-on-cpu.md), so None means CPU_IDLE_SPIN_S there and vLLM's own on CUDA.
    idle_spin_s: float | None = None
    # vLLM's --stream-interval: output tokens per streamed chunk (None: vLLM's 1, a chunk
    # per token). More per chunk costs the engine's and the router's CPU less per token,
    # and clients see tokens in bursts of that many (docs: "Streaming").
    stream_interval: int | None = None
    # vLLM's --prefix-caching-hash-algo; the router hashes prompts with the same one.
    prefix_caching_hash_algo: str = "sha256"
    # vLLM's --scheduling-policy. "priority": the engine takes waiting requests by the
    # `priority` the router sends (its class: batch lines last) and preempts the lowest
    # first when KV runs out. The worker registers it, so the router knows to send one.
    scheduling_policy: SchedulingPolicy = "priority"
    transport: NixlTransport | None = None
    # "sim" runs pdserve's simulator in vLLM's place: same API, same handoff.
    engine: EngineKind = "vllm"
    sim_profile: str = "tiny-cpu"
    sim_facts: SimFacts | None = None  # required with engine="sim"
    extra_args: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"engine port {self.port} is not a port")
        if self.kv_cache_gib < 1:
            raise ValueError("kv_cache_gib must be at least 1")
        if self.engine == "sim" and self.sim_facts is None:
            raise ValueError("a sim engine needs sim_facts: see localrun.sim_engine.sim_facts")
        if self.idle_spin_s is not None and not 0 <= self.idle_spin_s <= 10:
            raise ValueError("idle_spin_s must be within 0..10 seconds")
        if self.block_size is not None and self.device == "cpu" and self.block_size % 32:
            raise ValueError("on CPU, vLLM's block_size must be a multiple of 32")
        if self.stream_interval is not None and self.stream_interval < 1:
            raise ValueError("stream_interval must be at least 1")

    def resolved_block_size(self) -> int:
        if self.block_size:
            return self.block_size
        if self.sim_facts is not None:
            return self.sim_facts.block_size_tokens
        return DEFAULT_BLOCK_SIZE[self.device]

    def kv_capacity_tokens(self) -> int | None:
        """How many tokens of KV the engine holds (the router sizes its approximate index by it)."""
        if self.sim_facts is not None:
            return self.sim_facts.kv_capacity_tokens
        if self.device != "cpu":
            return None  # set by vLLM's memory profiling; not known before it runs
        bytes_per_token = kv_bytes_per_token(Path(self.model_path), self.dtype)
        return None if bytes_per_token is None else self.kv_cache_gib * 2**30 // bytes_per_token

    def accelerator(self) -> str:
        """The cost model's worker kind: the simulated accelerator, or the device here."""
        if self.sim_facts is not None:
            return self.sim_facts.accelerator
        return accelerator_name() if self.device == "cuda" else "cpu"

    def context_window(self) -> int | None:
        """--max-model-len, or what the engine defaults it to."""
        if self.max_model_len:
            return self.max_model_len
        if self.sim_facts is not None:
            return self.sim_facts.max_model_len
        return max_position_embeddings(Path(self.model_path))

    def kv_events_subscribe_endpoint(self) -> str | None:
        """Where the router connects: the engine binds the endpoint as named (the agent
        has vLLM bind a named host too); a wildcard becomes the engine's host."""
        if not self.kv_events_endpoint:
            return None
        return self.kv_events_endpoint.replace("*", self.host).replace("0.0.0.0", self.host)

    def argv(self) -> list[str]:
        if self.engine == "sim":
            return self._sim_argv()
        # `python -m ...api_server` works with the `vllm-cpu` distribution, whose
        # `vllm` CLI fails its own version lookup (see shared notes).
        args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model_path,
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--disable-uvicorn-access-log",
        ]
        eager = self.enforce_eager if self.enforce_eager is not None else self.device == "cpu"
        if eager:
            args.append("--enforce-eager")
        if self.device == "cuda":
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.dtype != "auto":
            args += ["--dtype", self.dtype]
        args += ["--block-size", str(self.resolved_block_size())]
        args += ["--prefix-caching-hash-algo", self.prefix_caching_hash_algo]
        args += self._stream_interval_args()
        args += ["--scheduling-policy", self.scheduling_policy]
        if self.transport:
            args += ["--kv-transfer-config", self.transport.kv_transfer_config()]
        if self.kv_events_endpoint:
            args += [
                "--kv-events-config",
                '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"'
                + self.kv_events_endpoint
                + '"}',
            ]
        return [*args, *self.extra_args]

    def _sim_argv(self) -> list[str]:
        role = self.transport.role if self.transport else "colocated"
        args = [
            sys.executable, "-m", "cli.main", "sim", "--model", self.model_path,
            "--served-model-name", self.served_model_name, "--host", self.host,
            "--port", str(self.port), "--role", role, "--profile", self.sim_profile,
        ]  # fmt: skip
        if self.transport:
            args += ["--kv-lease-s", str(self.transport.kv_lease_s)]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.block_size:
            args += ["--block-size", str(self.block_size)]
        if self.kv_events_endpoint:
            args += ["--kv-events-endpoint", self.kv_events_endpoint, "--kv-events-bind"]
        args += self._stream_interval_args()
        args += ["--scheduling-policy", self.scheduling_policy]
        return [*args, "--prefix-caching-hash-algo", self.prefix_caching_hash_algo]

    def _stream_interval_args(self) -> list[str]:
        return (
            [] if self.stream_interval is None else ["--stream-interval", str(self.stream_interval)]
        )

    def expected_placement(self) -> ExpectedPlacement | None:
        """Where the engine's threads must run (checked once it is ready); None: anywhere."""
        if not self.cores or self.engine != "vllm":
            return None  # a sim's cores model nothing: the OS places it
        if self.device == "cuda":
            return ExpectedPlacement(cuda_visible_devices=self.cores)
        cpus = parse_cpu_list(self.cores)
        # vLLM pins OpenMP's first thread, the one that runs the model, to the first core.
        return ExpectedPlacement(cpus=cpus, model_thread_cpu=min(cpus))

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ENGINE_SITE_DIR), base.get("PYTHONPATH", "")) if p
        )
        env["HF_HUB_OFFLINE"] = "1"
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        # The router pools connections to the engine; uvicorn's 5 s default makes it
        # reconnect after every short lull.
        env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")
        if self.device == "cpu":
            env["VLLM_TARGET_DEVICE"] = "cpu"
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
            if self.cores:
                env["VLLM_CPU_OMP_THREADS_BIND"] = self.cores
                if self.engine == "vllm":
                    env["PDSERVE_ENGINE_CPUS"] = self.cores
            if self.engine == "vllm":
                spin_s = CPU_IDLE_SPIN_S if self.idle_spin_s is None else self.idle_spin_s
                env["PDSERVE_ENGINE_IDLE_SPIN_S"] = str(spin_s)
            if self.transport:
                # vLLM 0.32's NixlConnector would move the model thread to the last core.
                env["PDSERVE_KEEP_MODEL_THREAD_CORES"] = "1"
        else:
            if self.cores:
                env["CUDA_VISIBLE_DEVICES"] = self.cores
            if self.idle_spin_s is not None:
                env["PDSERVE_ENGINE_IDLE_SPIN_S"] = str(self.idle_spin_s)
        if self.kv_events_endpoint:
            # The engine binds the endpoint as named (loopback), not only a wildcard.
            env["PDSERVE_KV_EVENTS_BIND"] = "1"
        if self.transport:
            env.update(self.transport.env())
        return env


def model_config(model_dir: Path) -> dict:
    """The model's config.json, or {} when it is missing or unreadable."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def max_position_embeddings(model_dir: Path) -> int | None:
    """vLLM's default max_model_len for plain (unscaled RoPE) models."""
    value = model_config(model_dir).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def kv_bytes_per_token(model_dir: Path, dtype: str = "auto") -> int | None:
    """K and V for every layer, from the model's config.json, in the dtype the engine
    runs (vLLM's KV cache follows the model's dtype)."""
    config = model_config(model_dir)
    checkpoint = config.get("torch_dtype") or config.get("dtype")
    try:
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads", heads)
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        element = dtype_bytes(dtype, checkpoint if isinstance(checkpoint, str) else None)
        return 2 * config["num_hidden_layers"] * kv_heads * head_dim * element
    except (KeyError, TypeError, ZeroDivisionError):
        return None
