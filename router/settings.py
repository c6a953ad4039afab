"""The router's one typed, frozen settings tree: a group per concern.

Every field is a knob: its ``description`` is its documentation, and
``PDSERVE_<FIELD>`` in the environment sets it. Field names are unique across
groups, so the environment stays flat and ``RouterSettings(kv_lease_s=10)`` is
accepted beside ``RouterSettings(leases=LeaseSettings(kv_lease_s=10))``.
``pdserve router --help-config`` prints the table docs/configuration.md carries.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from router.admission.tenants import TenantPolicy, parse_tenants
from router.observability.cost import parse_prices
from router.scheduling.scheduling_plugins import DECIDERS, POLICIES, parse_weights


def _pairs(spec: str) -> dict[str, str]:
    pairs = (item.partition("=") for item in spec.split(",") if item.strip())
    return {key.strip(): value.strip() for key, _, value in pairs}


# The scopes a person's token (``admin_tokens``) may have. ``agent`` is not among them:
# an agent's token is minted per worker from ``agent_secret`` (``contracts.agent_tokens``).
SCOPES = ("viewer", "planner", "operator", "reviewer", "admin")
# What each scope may do. ``admin`` does not include ``reviewer``: approving a version
# for prod and loosening a model's policy are duties of their own, so whoever rolls a
# version out cannot also approve it. ``policy`` (writing a model's policy) is shared by
# operators and reviewers; only a reviewer may loosen one (``RolloutControl.set_policy``).
# ``agent`` (register, heartbeat and deregister its own worker) is nobody else's duty.
SCOPE_GRANTS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"viewer"}),
    # The SLO planner in recommend mode: read, and publish a plan; it cannot change pools.
    "planner": frozenset({"viewer", "plan"}),
    "operator": frozenset({"viewer", "operator", "policy", "plan"}),
    "reviewer": frozenset({"viewer", "reviewer", "policy"}),
    "admin": frozenset({"viewer", "operator", "policy", "plan", "admin"}),
    "agent": frozenset({"agent"}),
}


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class ServerSettings(_Group):
    """The HTTP front door: bind address, auth, body and request caps."""

    host: str = Field("127.0.0.1", description="Bind address. Loopback unless told otherwise.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port for the API and admin.")
    admin_token: str | None = Field(
        None,
        description="An admin-scoped bearer token named `admin`, for people (the scoped ones "
        "are `admin_tokens`). No admin token set at all: the admin API answers 403.",
    )
    agent_secret: str | None = Field(
        None,
        description="The secret agents' tokens are minted from, one per worker id "
        "(`pdserve agent-token`): an agent may register, heartbeat and deregister its own "
        "worker, nothing else. Unset: no agent can register.",
    )
    allowed_worker_networks: tuple[str, ...] = Field(
        ("127.0.0.0/8", "::1/128"),
        description="CIDRs a registering worker's engine_url, KV event and NIXL hosts must "
        "fall in (comma-separated in env); a host name must resolve inside them. Default: "
        "loopback, as `pdserve up` runs.",
    )
    api_keys: tuple[str, ...] = Field(
        (), description="Client API keys (comma-separated in env). Empty: no client auth."
    )

    @field_validator("allowed_worker_networks")
    @classmethod
    def _networks(cls, networks: tuple[str, ...]) -> tuple[str, ...]:
        for network in networks:
            ipaddress.ip_network(network, strict=False)  # a ValueError names the bad one
        return networks

    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body; beyond it: 413."
    )
    max_tokens_cap: int = Field(
        32768, ge=1, description="Largest max_tokens a client may ask for; beyond it: 400."
    )
    max_choices_per_request: int = Field(
        16, ge=1, le=1024,
        description="Most choices (prompts in a list x n) one request may ask for; each is "
        "its own prefill and decode. Beyond it: 400.",
    )  # fmt: skip
    tokenize_offload_chars: int = Field(
        16384,
        ge=0,
        description="Prompts longer than this are tokenized in a thread, off the event loop.",
    )
    token_prefix_cache_tokens: int = Field(
        1_000_000,
        ge=0,
        le=100_000_000,
        description="Token ids of recent prompts' text prefixes the router keeps (4 bytes "
        "each), so a prompt that starts with one (a long system prompt, the next turn of a "
        "conversation) is tokenized only past it. 0: off.",
    )
    token_prefix_stride_chars: int = Field(
        1024,
        ge=64,
        le=1_000_000,
        description="The token prefix cache's granularity: a cached prefix ends near a "
        "multiple of this many characters (so up to this many shared ones are re-tokenized).",
    )
    early_bound_head_chars: int = Field(
        4096,
        ge=0,
        description="A prompt of over twice this many characters, headed for a pool with a "
        "queue that could make it late, is first tokenized this far: a worker whose cached "
        "prefix ends in that head holds none of the rest, so admission can refuse a request "
        "that would be late without tokenizing it all. 0: off.",
    )
    early_bound_rest_samples: int = Field(
        512,
        ge=0,
        le=100_000,
        description="Per model, how many recent long prompts (head measured, then the whole) "
        "teach the head bound how many tokens a prompt's unread rest has at least: a low "
        "quantile of their rest-to-head tokens per character. 0: a fixed 0.8 of the head's.",
    )
    retry_after_s: int = Field(
        2, ge=1, description="Retry-After sent with 503 when a pool has no ready worker."
    )
    max_embedding_inputs: int = Field(
        2048, ge=1, le=100_000,
        description="Inputs one `/v1/embeddings` request may carry (OpenAI's limit); more is "
        "a 413 `too_many_inputs`. `max_body_bytes` bounds their size.",
    )  # fmt: skip
    embedding_split_min_inputs: int = Field(
        32, ge=0, le=100_000,
        description="A `/v1/embeddings` request of at least twice this many inputs is cut "
        "across the embedding workers that are idle, in pieces of at least this many, and "
        "merged in order. 0: never cut.",
    )  # fmt: skip
    router_processes: int = Field(
        1, ge=1, le=64,
        description="Router processes sharing the port (the kernel spreads connections), for "
        "when one core is not enough. Above 1 needs `state_url` (Redis): the processes share "
        "workers, pools and rate limits through it, as replicas do; metrics add up over them "
        "(prometheus-client's multiprocess mode).",
    )  # fmt: skip


class UpstreamSettings(_Group):
    """Calls to worker engines: pool, timeouts, retries."""

    upstream_connect_timeout_s: float = Field(
        3.0, gt=0, description="Connect timeout to a worker engine. Low: fast failover."
    )
    prefill_timeout_s: float = Field(
        120.0, gt=0, description="Whole prefill call (max_tokens=1). Bounds TTFT on a stuck worker."
    )
    first_token_timeout_s: float = Field(
        120.0, gt=0, description="From decode request to its first byte."
    )
    stream_idle_timeout_s: float = Field(
        60.0, gt=0, description="Longest silence mid-stream before the stream is failed."
    )
    prefill_retries: int = Field(
        1, ge=0, le=3, description="Retries of a failed prefill on another prefill worker."
    )
    embedding_timeout_s: float = Field(
        60.0, gt=0, description="Whole `/v1/embeddings` call to an embedding worker."
    )
    embedding_retries: int = Field(
        1, ge=0, le=3,
        description="Retries of a failed embedding request (unreachable worker, 5xx) on "
        "another embedding worker.",
    )  # fmt: skip
    stream_migration_attempts: int = Field(
        2,
        ge=0,
        le=5,
        description="Workers tried to go on with a stream whose engine failed mid-answer "
        "(greedy or seeded completions and chats, once per stream; 0: migration off, the "
        "stream ends with an SSE error event).",
    )
    stream_migration_record_bytes: int = Field(
        1 << 20,
        ge=1024,
        le=1 << 28,
        description="What a migratable stream keeps of its output to go on from (about 12 "
        "bytes a token); a stream past it can no longer migrate.",
    )
    stream_migration_inexact: bool = Field(
        False,
        description="Also migrate streams that sample without a seed: the new worker samples "
        "on from the tokens already streamed, which is an answer the model could have given "
        "but not the one it would have; its chunks say so in `pdserve_migration`. Off: such "
        "a stream ends with an SSE error event when its engine fails.",
    )
    upstream_pool_size: int = Field(
        1024,
        ge=1,
        description="Open connections to engines, idle ones included, all workers "
        "together: for engine calls (streams wait for one past it, up to the connect timeout), "
        "and again for health probes and safety hooks.",
    )
    upstream_keepalive_s: float = Field(
        30.0,
        gt=0,
        le=300,
        description="Idle upstream connections are closed after this. Keep it below the "
        "engines' keep-alive (agents start vLLM with VLLM_HTTP_TIMEOUT_KEEP_ALIVE=60).",
    )

    def pool_arguments(self) -> dict[str, float | int]:
        """``Upstream``'s connection pool, from these knobs."""
        return {"pool_size": self.upstream_pool_size,
                "connect_timeout_s": self.upstream_connect_timeout_s,
                "keepalive_s": self.upstream_keepalive_s}  # fmt: skip


class LeaseSettings(_Group):
    """The KV handoff's lease: how long a prefill's blocks are held for a decode."""

    kv_lease_s: float = Field(
        30.0,
        gt=0,
        description="Handoff lease; must not exceed the workers' --kv-lease-s. "
        "An older handoff is re-prefilled, never forwarded.",
    )
    kv_lease_reprefills: int = Field(
        1,
        ge=0,
        le=3,
        description="When a decode fails after its handoff's lease ran out (the prefill's "
        "blocks may be gone), prefill again before trying the next decode, at most this "
        "many times per request.",
    )
    kv_lease_guard: bool = Field(
        True,
        description="Fail a streamed decode whose first token misses the KV lease, since "
        "vLLM may then read reused blocks. On in every shipped configuration and in the "
        "tests; off only to diagnose a box where decodes routinely start late.",
    )


class HealthSettings(_Group):
    """The worker registry: heartbeats, probes, capacity."""

    heartbeat_timeout_s: float = Field(
        10.0, gt=0, description="A worker silent this long is out of rotation."
    )
    forget_after_s: float = Field(
        300.0, gt=0, description="A worker silent this long is dropped from the registry."
    )
    health_interval_s: float = Field(
        2.0, gt=0, description="Period of the router's own /health probe of each engine."
    )
    health_timeout_s: float = Field(
        5.0, gt=0, description="One /health probe's limit. A busy CPU engine can be slow."
    )
    health_failures_to_eject: int = Field(
        3,
        ge=1,
        le=100,
        description="Consecutive failed probes before a worker leaves rotation. "
        "Failed requests take it out through its circuit breaker (circuit_*).",
    )
    stall_check_after_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="A stream whose engine sent nothing this long gets that engine probed "
        "at once (0: off). Decode steps take tens of ms; a second of silence is rare.",
    )
    stall_check_timeout_s: float = Field(
        1.0,
        gt=0,
        le=30,
        description="One stall probe's limit. vLLM's API server answers /health without "
        "its engine core, so a busy engine still answers in milliseconds.",
    )
    stall_check_failures: int = Field(
        2,
        ge=1,
        le=10,
        description="Stall probes failed in a row that eject a worker whose stream went "
        "silent: a hung engine leaves rotation, and its streams migrate, in about "
        "stall_check_after_s + this x stall_check_timeout_s.",
    )
    circuit_failures_to_open: int = Field(
        3,
        ge=1,
        le=100,
        description="Failed requests in a row (5xx, a broken stream, a bad handoff) that open "
        "a worker's circuit: out of rotation for circuit_open_s. An engine that cannot be "
        "reached at all opens it at once.",
    )
    circuit_open_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="How long an opened circuit keeps a worker out. Then one trial: traffic "
        "flows while its health probe passes, the next success closes the circuit, the next "
        "failure opens it again for twice as long.",
    )
    circuit_max_open_s: float = Field(
        60.0, gt=0, le=3600, description="The longest a circuit stays open after failed trials."
    )
    max_workers: int = Field(
        1024, ge=1, description="Registry capacity; registrations beyond it get 429."
    )
    serve_degraded: bool = Field(
        True,
        description="A P/D model with no ready prefill worker is served by its decode workers "
        "alone (they compute the prompt), and one with no ready decode worker by its prefill "
        "workers alone, as colocated ones; so is a request whose every prefill (or decode) "
        "attempt failed. Off: 503 until both pools are back, and such a request fails.",
    )

    def registry_arguments(self) -> dict[str, float | int | bool]:
        """``WorkerRegistry``'s bounds, from these knobs."""
        return {"heartbeat_timeout_s": self.heartbeat_timeout_s,
                "forget_after_s": self.forget_after_s, "max_workers": self.max_workers,
                "serve_degraded": self.serve_degraded,
                "circuit_failures_to_open": self.circuit_failures_to_open,
                "circuit_open_s": self.circuit_open_s,
                "circuit_max_open_s": self.circuit_max_open_s}  # fmt: skip


class RoutingSettings(_Group):
    """Worker choice: policies, plug-in weights, bounded load, the P/D decider."""

    routing_policy: str = Field(
        "prefix_affinity",
        description="How a worker is chosen in a pool: prefix_affinity (cached prefix, then "
        "queue, with bounded load), least_loaded, or round_robin.",
    )
    routing_policy_by_model: str = Field(
        "",
        description="Per-model policy overrides, `model=policy,...` (model names or aliases).",
    )
    model_aliases: str = Field(
        "",
        description="Extra names for served models, `alias=model,...`: an alias is served by "
        "the model's workers under its own routing policy, so two policies can run side by "
        "side on the same pool.",
    )
    prefill_scorers: str = Field(
        "uncached_tokens=1,queued_tokens=0.02",
        description="prefix_affinity's prefill cost, `scorer=weight,...` in token units. "
        "Scorers: uncached_tokens, queued_tokens, running_requests, kv_usage, engine_waiting.",
    )
    decode_scorers: str = Field(
        "uncached_tokens=0.1,running_requests=64,kv_usage=2048",
        description="prefix_affinity's decode cost: KV headroom and running load first; "
        "uncached_tokens prefers the decode that holds the prefix (a later chat turn).",
    )
    bounded_load_epsilon: float = Field(
        0.5,
        ge=0,
        le=10,
        description="A worker with ceil((1+epsilon) x mean) requests in flight loses its "
        "prefix affinity, so none carries over (1+epsilon) x the mean. Lower: more even "
        "load, fewer cache hits.",
    )
    bounded_load_floor: int = Field(
        4,
        ge=0,
        le=10_000,
        description="Below this many requests in flight a worker keeps its prefix affinity "
        "whatever the mean (at low load, ceil of a fractional mean would allow just one).",
    )
    bounded_load_token_floor: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="Also bound load in queued uncached prompt tokens: a worker whose queue "
        "plus this prompt would exceed max(this, (1+epsilon) x mean) loses affinity, so short "
        "prompts do not wait behind a long prefill. 0: off.",
    )
    conditional_disagg_max_uncached_tokens: int = Field(
        0,
        ge=0,
        description="Prefill on the decode worker, skipping the KV transfer, when at most "
        "this many prompt tokens are not cached there. 0: always disaggregate.",
    )
    conditional_disagg_max_kv_usage: float = Field(
        0.8,
        ge=0,
        le=1,
        description="... and only while that decode worker's KV usage is below this.",
    )
    hotspot_window_requests: int = Field(
        1000, ge=10, le=1_000_000, description="Decisions the hotspot factor is computed over."
    )

    pd_decider: str = Field(
        "conditional_disagg",
        description="How a request with both pools ready is served: always_disaggregate, or "
        "conditional_disagg (prefill on the decode worker when its uncached part is short; "
        "see the two conditional_disagg_* knobs).",
    )

    def policies_by_model(self) -> dict[str, str]:
        """``routing_policy_by_model`` as a mapping."""
        return _pairs(self.routing_policy_by_model)

    def aliases(self) -> dict[str, str]:
        """``model_aliases`` as alias -> served model."""
        return _pairs(self.model_aliases)

    def policy_of(self, model: str) -> str:
        return self.policies_by_model().get(model, self.routing_policy)

    @model_validator(mode="after")
    def _check_names(self) -> RoutingSettings:
        if self.routing_policy not in POLICIES:
            raise ValueError(f"routing_policy {self.routing_policy!r}; known: {sorted(POLICIES)}")
        for model, policy in self.policies_by_model().items():
            if policy not in POLICIES:
                raise ValueError(
                    f"routing_policy_by_model: {model}={policy}; known: {sorted(POLICIES)}"
                )
        if self.pd_decider not in DECIDERS:
            raise ValueError(f"pd_decider {self.pd_decider!r}; known: {sorted(DECIDERS)}")
        parse_weights(self.prefill_scorers)
        parse_weights(self.decode_scorers)
        return self


class IndexSettings(_Group):
    """The prefix index: sources, capacity, record lifetimes, the hash memo."""

    prefix_index_source: Literal["precise", "approximate", "both"] = Field(
        "both",
        description="precise: engines' KV events; approximate: what the router sent where "
        "(TTL + capacity); both: events, and the approximate index while a worker's events "
        "are missing or gapped.",
    )
    prefix_index_max_blocks: int = Field(
        1_000_000, ge=1, description="Prefix index capacity in distinct blocks (LRU beyond)."
    )
    prefix_speculative_ttl_s: float = Field(
        5.0,
        gt=0,
        description="How long a routing-time record stands in for a worker whose events flow "
        "(bridges the gap until its BlockStored arrives).",
    )
    prefix_approximate_ttl_s: float = Field(
        120.0, gt=0, description="How long a routing-time record counts without events."
    )
    kv_events_fallback_s: float = Field(
        30.0,
        gt=0,
        description="After a gap in a worker's KV events, use the approximate index for it "
        "this long.",
    )
    block_hash_memo_entries: int = Field(
        65536,
        ge=0,
        le=10_000_000,
        description="Blocks whose hash is remembered (LRU): shared prefixes are hashed once.",
    )
    prefix_expire_interval_s: float = Field(
        5.0, gt=0, description="How often expired routing-time records are swept."
    )


class ControlSettings(_Group):
    """The control plane's admin API: scoped tokens, live P:D ratio changes."""

    state_url: str = Field(
        "",
        description="Where control-plane state lives: empty for this process's memory (one "
        "router), or `redis://host:port/db` to share workers, holds, targets and the audit "
        "log between router replicas.",
    )
    admin_tokens: str = Field(
        "",
        description="Scoped admin tokens, `name:scope:token,...`; scopes: viewer (read), "
        "planner (read, and publish the SLO planner's plans: `pdserve planner` in recommend "
        "mode), operator (pools, drains, models, routes, promote, rollback, plans), reviewer "
        "(read, the review queue, approving versions, loosening a model's policy), admin (all but "
        "reviewing). `admin_token` is an admin token named `admin`. Names, never tokens, go "
        "into the audit log.",
    )
    rerole_step_workers: int = Field(
        1, ge=1, le=64, description="Workers a P:D ratio change re-roles at once."
    )
    rerole_timeout_s: float = Field(
        900.0,
        gt=0,
        description="How long one re-role step may take (drain, engine restart in the new "
        "role, registration) before the change is marked failed.",
    )
    scaler: Literal["local", "kubernetes"] = Field(
        "local",
        description="How a P:D change reaches the pools: `local` re-roles the workers a "
        "model has (the total stays); `kubernetes` sets the replicas of the pools' "
        "Deployments (`scaler_deployments`) through the scale subresource, in the pod's "
        "service account or a kubeconfig.",
    )
    scaler_namespace: str = Field(
        "default", max_length=253, description="The namespace of the pools' Deployments."
    )
    scaler_deployments: str = Field(
        "",
        description="The Deployment of each model's pool, `model/prefill=name,"
        "model/decode=name,...` (the `kubernetes` scaler).",
    )
    scaler_min_replicas: int = Field(
        1,
        ge=1,
        le=10_000,
        description="The fewest replicas the `kubernetes` scaler sets a pool to.",
    )
    scaler_max_replicas: int = Field(
        16, ge=1, le=10_000, description="The most replicas the `kubernetes` scaler gives a pool."
    )
    scale_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="How long a Kubernetes scale may take until the pools' ready workers "
        "match it (new pods pull and load weights) before the change is marked failed.",
    )
    max_operations_kept: int = Field(
        100, ge=1, le=100_000, description="Finished pool operations kept for GET (oldest go)."
    )
    audit_entries_kept: int = Field(
        10_000, ge=1, le=10_000_000, description="Audit log entries kept (oldest dropped)."
    )

    def scaler_deployment_names(self) -> dict[tuple[str, str], str]:
        """(model, role) -> Deployment name, from ``scaler_deployments``."""
        names: dict[tuple[str, str], str] = {}
        for item in filter(None, (part.strip() for part in self.scaler_deployments.split(","))):
            key, _, name = item.partition("=")
            model, _, role = key.rpartition("/")
            if not (model and name) or role not in ("prefill", "decode"):
                raise ValueError(
                    f"scaler_deployments: {item!r} is not model/prefill=name or model/decode=name"
                )
            names[(model, role)] = name
        return names

    def scoped_tokens(self) -> dict[str, tuple[str, str]]:
        """token -> (name, scope)."""
        tokens: dict[str, tuple[str, str]] = {}
        for item in filter(None, (part.strip() for part in self.admin_tokens.split(","))):
            name, scope, token = item.split(":", 2)
            tokens[token] = (name, scope)
        return tokens

    @model_validator(mode="after")
    def _check_tokens(self) -> ControlSettings:
        if self.state_url and not self.state_url.startswith(("redis://", "rediss://")):
            raise ValueError("state_url must be empty or a redis:// URL")
        self.scaler_deployment_names()  # a malformed entry is refused at start
        if self.scaler_min_replicas > self.scaler_max_replicas:
            raise ValueError("scaler_min_replicas must not exceed scaler_max_replicas")
        for item in filter(None, (part.strip() for part in self.admin_tokens.split(","))):
            parts = item.split(":", 2)
            if len(parts) != 3 or not all(parts) or parts[1] not in SCOPES:
                raise ValueError(
                    f"admin_tokens: each entry is name:scope:token with scope in {SCOPES}"
                )
        return self


class AdmissionSettings(_Group):
    """Admission: request limits, tenants' buckets and priorities, the prefill queue,
    predicted-TTFT early rejection and decode KV headroom."""

    max_messages: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Most messages one chat request may carry; beyond: 400.",
    )
    max_message_chars: int = Field(
        1_048_576,
        ge=1,
        description="Longest single message (or prompt) in characters; beyond: 400.",
    )
    default_max_tokens: int = Field(
        0,
        ge=0,
        description="max_tokens given to a request that sets none. 0: as vLLM (the rest of "
        "the context window). Per model: `default_max_tokens_by_model`.",
    )
    default_max_tokens_by_model: str = Field(
        "", description="Per-model default max_tokens, `model=N,...`."
    )
    max_prompt_tokens_by_model: str = Field(
        "",
        description="Per-model prompt caps below the context window, `model=N,...`; "
        "beyond: 400 `model_prompt_limit`.",
    )
    max_output_tokens_by_model: str = Field(
        "",
        description="Per-model output caps, `model=N,...`; beyond: 400 `model_output_limit` "
        "(and the default for requests that set none, when lower).",
    )
    tenants: str = Field(
        "",
        description='Tenant policies as JSON: `{"name": {"keys": [api keys], "rpm": N, '
        '"tpm": N, "priority": interactive|standard|batch, "weight": W, '
        '"max_prompt_tokens": N, "max_output_tokens": N}}`. A tenant\'s keys are client '
        "API keys. 0 or absent: no limit.",
    )
    default_tenant_rpm: float = Field(
        0, ge=0, description="Requests per minute for callers no tenant names. 0: no limit."
    )
    default_tenant_tpm: float = Field(
        0,
        ge=0,
        description="Tokens per minute (prompt + max_tokens) for callers no tenant names. "
        "0: no limit.",
    )
    ttft_slo_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="The TTFT a request must be able to meet to be admitted: a request whose "
        "predicted TTFT is over it gets 429 at once, and one still queued past it is dropped "
        "(429). A client may ask for less with `x-pdserve-ttft-slo-ms`, never more.",
    )
    ttft_slo_headroom: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Admission aims at this fraction of the TTFT SLO (predicted TTFT and the "
        "queue deadline), leaving the rest for the predictor's error.",
    )
    ttft_slo_by_model: str = Field("", description="Per-model TTFT SLO, `model=seconds,...`.")
    batch_prefill_share: float = Field(
        0.05, gt=0, le=1,
        description="Batch lines together hold at most this fraction of the TTFT target's "
        "worth of prefill (at the pool's rate) in the engines' queue (one line per prefill "
        "worker prefilling no other work always may), spread over the workers (a line goes "
        "to the spare one holding the least batch work). "
        "They get none while an interactive request waits, while every prefill worker is "
        "prefilling other work, or for `batch_yield_after_refusal_s` after a request "
        "refused for want of room (429 `batch_yields`: the line tries again shortly). An "
        "interactive prompt arriving behind batch lines waits at most about that long for "
        "them.",
    )  # fmt: skip
    batch_yield_after_refusal_s: float = Field(
        1.0, ge=0, le=60,
        description="After another request is refused for want of room (a late forecast, "
        "the queue, decode KV), batch lines yield (429 `batch_yields`) for this long: "
        "about the time a burst takes to drain at the TTFT scale. 0: only while a "
        "request waits or every prefill worker is busy with other work.",
    )  # fmt: skip
    batch_prefill_take_back: bool = Field(
        False,
        description="When a prompt that does not yield is sent to a prefill worker, the "
        "batch lines' prefills under way there are cancelled (the engine aborts them; "
        "their full blocks stay in its prefix cache) and go again later (429 "
        "`batch_yields`): an engine's priority orders only what waits, and a running "
        "prefill keeps its part of every step the prompt needs. Disaggregated pools. Off "
        "by default: with one-step batch lines (the batch benchmark's) it cut interactive "
        "TTFT p50 by 4-8% and the batch's pace by 30% (production trace) to 87% (shared "
        "prefixes), a smaller share's trade-off; it is meant for batch lines long enough "
        "to span several steps.",
    )  # fmt: skip
    batch_queue_wait_s: float = Field(
        30.0, gt=0, le=3600,
        description="How long a batch line may wait in the prefill queue for room; then "
        "429 `queue_deadline`, and its batch sends fewer lines at once.",
    )  # fmt: skip
    refuse_prompts_past_slo: bool = Field(
        True,
        description="Refuse (413 `prompt_exceeds_ttft_slo`, not retryable) a prompt whose own "
        "prefill and KV handoff, forecast on idle workers from their measured speed (probe or "
        "own prefills, never the prior), is over the TTFT SLO: it would miss even alone. "
        "Off: it is served, late, when the pool is idle (429 `prompt_needs_idle_pool` "
        "while it is not). A deployment serving very long prompts raises the model's SLO.",
    )
    prefill_queue_tokens_per_worker: int = Field(
        16384,
        ge=1,
        description="The prefill queue's bound, in uncached prompt tokens per first-hop "
        "worker: past it, requests wait in the router (by priority, fair between tenants).",
    )
    prefill_queue_slo_fraction: float = Field(
        0.5,
        gt=0,
        le=10,
        description="Also bound the prefill queue in time: at most this fraction of the "
        "model's TTFT SLO of work (at the workers' learned prefill rates) is let into the "
        "engines, whose queues are first come first served; the rest waits in the router, "
        "where priority and tenant shares apply.",
    )
    max_queued_requests: int = Field(
        1024, ge=0, le=1_000_000, description="Requests one model's queue may hold; beyond: 429."
    )
    prior_prefill_tokens_per_s: float = Field(
        2_000.0,
        gt=0,
        description="Prefill throughput assumed for a worker whose agent sent no prefill "
        "probe, until 8 of its own prefills teach the TTFT predictor. Low on purpose: a cold "
        "pool under a burst refuses a little early rather than queue what will miss (see "
        "benchmarks/results/admission/README.md).",
    )
    expected_output_tokens: int = Field(
        1024,
        ge=1,
        description="Output KV reserved per request on the decode side: its max_tokens "
        "(or, with none, the rest of the context), but at most this many tokens.",
    )
    decode_kv_overcommit: float = Field(
        1.0,
        gt=0,
        le=100,
        description="How far the KV reserved on a decode worker (per request in flight: the "
        "prompt blocks it did not hold, plus the expected output) may exceed its capacity. "
        "1: never.",
    )
    preemption_cooldown_s: float = Field(
        5.0,
        ge=0,
        description="A worker whose engine preempted requests gets no new work for this long "
        "after its latest preemption (while another worker can take it).",
    )

    def tenant_policies(self) -> dict[str, TenantPolicy]:
        return parse_tenants(self.tenants)

    def default_tenant(self) -> TenantPolicy:
        return TenantPolicy(rpm=self.default_tenant_rpm, tpm=self.default_tenant_tpm)

    def model_caps(self, model: str) -> tuple[int | None, int | None]:
        """(prompt, output) token caps for the model; None: no cap of its own."""
        prompt = _pairs(self.max_prompt_tokens_by_model).get(model)
        output = _pairs(self.max_output_tokens_by_model).get(model)
        return (int(prompt) if prompt else None), (int(output) if output else None)

    def ttft_slo_of(self, model: str) -> float:
        return float(_pairs(self.ttft_slo_by_model).get(model, self.ttft_slo_s))

    def default_max_tokens_of(self, model: str) -> int:
        return int(_pairs(self.default_max_tokens_by_model).get(model, self.default_max_tokens))

    @model_validator(mode="after")
    def _check_maps(self) -> AdmissionSettings:
        numeric = (
            (self.max_prompt_tokens_by_model, int),
            (self.max_output_tokens_by_model, int),
        )
        for spec, cast in (
            *numeric,
            (self.ttft_slo_by_model, float),
            (self.default_max_tokens_by_model, int),
        ):
            for model, value in _pairs(spec).items():
                try:
                    cast(value)
                except ValueError:
                    raise ValueError(f"{model}={value!r}: not a number") from None
        self.tenant_policies()
        return self


class MetricsSettings(_Group):
    """Observability: the window behind the rate and cost gauges, and the cost model."""

    metrics_window_s: float = Field(
        60.0, ge=1, le=3600,
        description="Window of the tokens/s and $/1M-token gauges and of `pdserve status`'s "
        "TTFT percentiles. Prometheus can compute any other window from the counters.",
    )  # fmt: skip
    recent_ttft_samples: int = Field(
        4096, ge=16, le=1_000_000,
        description="Most TTFT samples kept per model for the status view's p50/p99 (the "
        "newest win).",
    )  # fmt: skip
    arrival_clump_window_s: float = Field(
        0.001, ge=0, le=1,
        description="Arrivals of a model within this of the previous one count as one clump "
        "(`pdserve_arrival_clump_size`, per router process): a burst's requests wait for "
        "each other, which the SLO planner plans for. 0: every arrival alone.",
    )  # fmt: skip
    worker_cost_usd_per_hour: str = Field(
        '{"default": 0.10}',
        description="The cost model: JSON of worker kind -> $/hour. Kinds are what agents "
        'report: "cpu", or the accelerator\'s name ("nvidia-h100-80gb-hbm3"); sims report '
        'their profile\'s. "default" prices any kind not listed. Worker-seconds count while '
        "a worker is registered, ready or not.",
    )  # fmt: skip

    def prices(self) -> dict[str, float]:
        return parse_prices(self.worker_cost_usd_per_hour)

    @model_validator(mode="after")
    def _check_prices(self) -> MetricsSettings:
        self.prices()
        return self


class RolloutSettings(_Group):
    """Versions in production: the canary gate's figures, shadow traffic, the review queue."""

    rollout_samples_kept: int = Field(
        20_000, ge=100, le=1_000_000,
        description="Samples kept per model, stage and series (TTFT, ITL, answers) for the "
        "canary gate; a gate window holding more judges the newest.",
    )  # fmt: skip
    gate_check_interval_s: float = Field(
        5.0, gt=0, le=3600,
        description="How often each canary is judged against its gate (and rolled back "
        "when it breaches and the gate says auto_rollback).",
    )  # fmt: skip
    shadow_max_inflight: int = Field(
        16, ge=0, le=10_000,
        description="Mirrored requests in flight at once per router; past it, shadow copies "
        "are shed (counted), never queued.",
    )  # fmt: skip
    shadow_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="A mirrored request is abandoned after this long."
    )
    shadow_records_kept: int = Field(
        1000, ge=1, le=1_000_000,
        description="Shadow comparisons kept per router for GET .../routes/{model}/shadow.",
    )  # fmt: skip
    review_items_kept: int = Field(
        10_000, ge=1, le=10_000_000,
        description="Flagged items kept in the review queue (oldest dropped).",
    )  # fmt: skip


class BatchSettings(_Group):
    """The Files and Batch API: where files live, their caps, and how batches run."""

    files_dir: str = Field(
        ".pdserve/files",
        description="The local directory `/v1/files` keeps files in (uploads, and batches' "
        "output and error files). Replicas that share batches need it shared too.",
    )
    max_file_bytes: int = Field(
        200 * 1024 * 1024, ge=1024, le=10 * 1024**3,
        description="Largest file `/v1/files` takes; beyond it: 413 `file_too_large`, and "
        "nothing is kept.",
    )  # fmt: skip
    max_files: int = Field(
        10_000, ge=1, le=10_000_000,
        description="Files kept at once; an upload past it is refused (400 `storage_full`).",
    )  # fmt: skip
    max_batches: int = Field(
        1000, ge=1, le=1_000_000,
        description="Batches kept in the state; a new one pushes out the oldest ended one "
        "(with none ended: 429 `too_many_batches`).",
    )  # fmt: skip
    max_batch_lines: int = Field(
        50_000, ge=1, le=1_000_000, description="Requests one batch may hold (OpenAI's limit)."
    )
    batch_max_in_flight: int = Field(
        32, ge=1, le=10_000,
        description="Most of a batch's lines in flight at once on one router. Within it, "
        "the runner sends more while admission takes its lines and half as many when it "
        "refuses one for want of room (`batch_queue_wait_s` run out, decode KV, a rate "
        "limit); a yield to interactive traffic (`batch_yields`) only delays the line.",
    )  # fmt: skip
    batch_max_active: int = Field(
        4, ge=0, le=1000,
        description="Batches one router runs at once (0: this router runs none; another "
        "replica sharing the state does).",
    )  # fmt: skip
    batch_lease_s: float = Field(
        15.0, gt=1, le=3600,
        description="How long a router's hold on a batch lasts unrenewed: after a router "
        "dies, another takes its batches over within this.",
    )  # fmt: skip
    batch_poll_s: float = Field(
        1.0, gt=0, le=600, description="How often a router looks for batches to run."
    )


class RouterSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    server: ServerSettings = Field(default_factory=ServerSettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    leases: LeaseSettings = Field(default_factory=LeaseSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    index: IndexSettings = Field(default_factory=IndexSettings)
    control: ControlSettings = Field(default_factory=ControlSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)

    @model_validator(mode="before")
    @classmethod
    def _flat_names_into_groups(cls, values: Any) -> Any:
        """Accept every knob by its own (flat, unique) name, as the environment spells it."""
        if not isinstance(values, dict):
            return values
        grouped: dict[str, Any] = {}
        for name, value in values.items():
            group = _GROUP_OF.get(name)
            if group is None:
                grouped[name] = value
                continue
            section = grouped.setdefault(group, {})
            if isinstance(section, dict):
                section[name] = value
        return grouped

    @classmethod
    def from_env(cls, **overrides: object) -> RouterSettings:
        """Settings from ``PDSERVE_*`` variables, then explicit overrides.

        Raises ``ValueError`` naming every bad field, so a bad config is refused whole.
        """
        values: dict[str, object] = {}
        for name in _GROUP_OF:
            raw = os.environ.get(f"PDSERVE_{name.upper()}")
            if raw is None:
                continue
            listed = name in ("api_keys", "allowed_worker_networks")
            values[name] = tuple(k.strip() for k in raw.split(",") if k.strip()) if listed else raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**values)
        except ValidationError as error:
            raise ValueError(f"invalid router settings: {error}") from error


def settings_table() -> str:
    """The Markdown knob table, generated from the field descriptions, group by group."""
    rows = ["| group | setting | env var | default | what it does |", "|---|---|---|---|---|"]
    for group, section in RouterSettings.model_fields.items():
        assert isinstance(section.annotation, type)
        for name, field in section.annotation.model_fields.items():
            default = field.default if field.default not in ((), None) else "unset"
            rows.append(
                f"| {group} | `{name}` | `PDSERVE_{name.upper()}` | `{default}` | "
                f"{field.description} |"
            )
    return "\n".join(rows)


# knob name -> its group; names are unique across groups (checked at import).
_GROUP_OF: dict[str, str] = {}
for _group, _section in RouterSettings.model_fields.items():
    assert isinstance(_section.annotation, type)
    for _name in _section.annotation.model_fields:
        assert _name not in _GROUP_OF, f"knob {_name!r} is in two groups"
        _GROUP_OF[_name] = _group
