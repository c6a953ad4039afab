"""Worker registration and heartbeat records exchanged between agents and the router.

Invariant: a worker is eligible for traffic only while its latest heartbeat says
``ready`` and arrived within the router's heartbeat timeout. An agent says ready
only after its vLLM server has loaded weights and answered ``/health``.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, NewType

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.block_hashing import HASH_FUNCTIONS

WIRE_VERSION = 1

WorkerId = NewType("WorkerId", str)


# vLLM's --scheduling-policy values.
SchedulingPolicy = Literal["fcfs", "priority"]


class WorkerRole(str, Enum):
    """What a worker does in the request path."""

    PREFILL = "prefill"  # vLLM kv_producer: computes prompt KV, hands it off
    DECODE = "decode"  # vLLM kv_consumer: pulls KV, streams tokens
    COLOCATED = "colocated"  # plain vLLM: prefill and decode in one engine
    EMBED = "embed"  # vLLM's pooling runner: embeds inputs, generates nothing


class WorkerLoad(BaseModel):
    """Load as scraped from the worker's vLLM /metrics (vLLM's own names)."""

    model_config = ConfigDict(frozen=True)

    num_requests_running: float = 0.0
    num_requests_waiting: float = 0.0
    kv_cache_usage_perc: float = 0.0
    # Lifetime counters (tokens), so the router can set observed prefix hits
    # against its own predictions.
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    # Lifetime count of requests the engine preempted (KV ran out mid-decode).
    num_preemptions: float = 0.0
    # Lifetime prompt tokens the KV connector was asked for and found on a peer: on a
    # decode worker, the prompt pulled from prefill (not a prefix-cache miss).
    external_prefix_cache_queries: float = 0.0
    external_prefix_cache_hits: float = 0.0
    # Lifetime NIXL transfers this engine pulled (vLLM's nixl_* metrics): count, seconds,
    # bytes, and failures (handshake and notification failures included).
    kv_transfers: float = 0.0
    kv_transfer_seconds: float = 0.0
    kv_transfer_bytes: float = 0.0
    kv_transfer_failures: float = 0.0
    # Measured by the agent, not vLLM: resident memory of the engine's processes, and on
    # a GPU the accelerator memory they hold and the devices' total (0 when none).
    engine_memory_bytes: float = 0.0
    accelerator_memory_used_bytes: float = 0.0
    accelerator_memory_total_bytes: float = 0.0
    # False when the agent could not read the engine's /metrics: the zeros above are
    # then not "idle", and the router prefers any worker whose load it knows.
    known: bool = True


class WorkerRegistration(BaseModel):
    """Sent by an agent when its engine becomes ready, and again after a restart."""

    model_config = ConfigDict(frozen=True)

    wire_version: int = WIRE_VERSION
    worker_id: str = Field(min_length=1, max_length=200)
    role: WorkerRole
    model: str = Field(min_length=1, max_length=200, description="served model name")
    # The registered version of the model the engine loaded (``contracts.rollout``);
    # None for a worker outside the model registry.
    model_version: str | None = Field(default=None, max_length=128)
    # The loaded folder's checksum (``modelstore.checksum``), sent with a version: the
    # router refuses a worker whose files are not the registered artifact's.
    model_checksum: str | None = Field(default=None, max_length=200)
    engine_url: str = Field(min_length=1, max_length=500, description="vLLM base URL")
    # Where a subscriber connects for the engine's KV events (tcp://HOST:PORT).
    kv_events_endpoint: str | None = Field(default=None, max_length=500)
    # What the router needs to hash prompts the way this engine's prefix cache does.
    block_size: int | None = Field(default=None, ge=1, le=4096)
    prefix_caching_hash_algo: str = Field(default="sha256", max_length=50)
    # The engine's NONE_HASH seed (its PYTHONHASHSEED) when not vLLM's default.
    prefix_hash_seed: str | None = Field(default=None, max_length=200)
    tokenizer_path: str | None = Field(default=None, max_length=1000, description="model folder")
    kv_capacity_tokens: int | None = Field(default=None, ge=0)
    # Prompt plus output tokens the engine accepts (vLLM's --max-model-len).
    max_model_len: int | None = Field(default=None, ge=1)
    engine_pid: int | None = None
    # vLLM's --scheduling-policy. "priority": the router sends each request's class as its
    # `priority` (lower first), so batch lines wait behind interactive ones in the engine
    # too, and KV preemption takes them first; "fcfs": no `priority` is sent.
    scheduling_policy: SchedulingPolicy = "fcfs"
    # What the worker runs on, for the cost model's $/hour: "cpu", or the accelerator's
    # name ("nvidia-h100-80gb-hbm3"), lower case with dashes.
    accelerator: str = Field(default="cpu", min_length=1, max_length=100)

    # (prompt tokens, seconds) of prompts the agent timed on the fresh engine, each with
    # max_tokens=1 and no prefix hit (``agent.prefill_probe``): the router's TTFT
    # predictor starts this worker's line from them. Empty: not measured.
    prefill_probe: tuple[tuple[int, float], ...] = Field(default=(), max_length=16)

    # Seconds of each part of this engine's start, as its agent measured them
    # (``agent.start_phases``): ``pull`` (the weights into the node's cache), then either
    # ``process_start``, ``weights_load`` and ``engine_warm_up`` (vLLM's own profile, KV
    # cache and warm-up), or ``engine_start`` whole where vLLM's log cannot be read, then
    # ``probe`` (the agent's prefill probe). Empty: not measured.
    start_phases: dict[str, float] = Field(default_factory=dict, max_length=8)

    # Bumped by the agent on each engine (re)start so the router can tell a restart
    # from a heartbeat and drop per-incarnation state.
    incarnation: int = 0

    @field_validator("prefix_caching_hash_algo")
    @classmethod
    def _hashable_by_the_router(cls, name: str) -> str:
        # Accepting an algorithm the router cannot compute would fail every request
        # of the pool later; refusing the registration names the problem now.
        if name not in HASH_FUNCTIONS:
            raise ValueError(f"unsupported prefix_caching_hash_algo {name!r}; "
                             f"supported: {sorted(HASH_FUNCTIONS)}")  # fmt: skip
        return name


class WorkerHeartbeat(BaseModel):
    """Periodic liveness and load report from an agent."""

    model_config = ConfigDict(frozen=True)

    wire_version: int = WIRE_VERSION
    worker_id: str = Field(min_length=1, max_length=200)
    ready: bool
    draining: bool = False
    incarnation: int = 0
    load: WorkerLoad = WorkerLoad()
    # Versions of this worker's model that are pulled and verified in its node's cache
    # (``modelstore.pull``): a canary's pre-pull gate counts them.
    pulled_versions: tuple[str, ...] = Field(default=(), max_length=32)


class PullOrder(BaseModel):
    """Pull this version of the worker's model into its node's cache (a canary's
    pre-pull): from ``artifact``, verified against ``checksum``."""

    model_config = ConfigDict(frozen=True)

    version: str = Field(min_length=1, max_length=128)
    artifact: str = Field(min_length=1, max_length=1000)
    checksum: str = Field(min_length=1, max_length=200)


class HeartbeatReply(BaseModel):
    """The router's answer to a heartbeat: what the control plane wants of this worker.

    ``role``: serve this role instead (the pool's P:D ratio changed): drain, restart the
    engine in that role and register again. None: carry on. ``pull``: pull another
    version into the node's cache, beside the one served (nothing restarts).
    """

    model_config = ConfigDict(frozen=True)

    ok: bool = True
    role: WorkerRole | None = None
    pull: PullOrder | None = None
