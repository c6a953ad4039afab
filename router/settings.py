"""The router's one typed, frozen settings tree.

Every field is a knob: its docstring (``description``) is its documentation, and
``PDSERVE_<FIELD>`` in the environment sets it. ``pdserve router --help-config``
prints the table that the README carries.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class RouterSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="Bind address. Loopback unless told otherwise.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port for the API and admin.")
    admin_token: str | None = Field(
        None,
        description="Bearer token for /admin (worker registration, config). "
        "Unset: the admin API answers 403.",
    )
    api_keys: tuple[str, ...] = Field(
        (), description="Client API keys (comma-separated in env). Empty: no client auth."
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body; beyond it: 413."
    )
    max_tokens_cap: int = Field(
        32768, ge=1, description="Largest max_tokens a client may ask for; beyond it: 400."
    )
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
    kv_lease_s: float = Field(
        30.0,
        gt=0,
        description="Handoff lease; must not exceed the workers' --kv-lease-s. "
        "An older handoff is re-prefilled, never forwarded.",
    )
    kv_lease_guard: bool = Field(
        True,
        description="Fail a streamed decode whose first token misses the KV lease, since "
        "vLLM may then read reused blocks. Off only where decodes routinely start late "
        "(a starved test box), so that slow is not mistaken for broken.",
    )
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
        "A failed request ejects it at once regardless.",
    )
    max_workers: int = Field(
        1024, ge=1, description="Registry capacity; registrations beyond it get 429."
    )
    upstream_pool_size: int = Field(
        1024, ge=1, description="Pooled upstream connections (all workers together)."
    )
    upstream_keepalive_s: float = Field(
        30.0,
        gt=0,
        le=300,
        description="Idle upstream connections are closed after this. Keep it below the "
        "engines' keep-alive (agents start vLLM with VLLM_HTTP_TIMEOUT_KEEP_ALIVE=60).",
    )
    retry_after_s: int = Field(
        2, ge=1, description="Retry-After sent with 503 when a pool has no ready worker."
    )

    @classmethod
    def from_env(cls, **overrides: object) -> RouterSettings:
        """Settings from ``PDSERVE_*`` variables, then explicit overrides.

        Raises ``ValueError`` naming every bad field, so a bad config is refused whole.
        """
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = os.environ.get(f"PDSERVE_{name.upper()}")
            if raw is None:
                continue
            values[name] = tuple(k for k in raw.split(",") if k) if name == "api_keys" else raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**values)
        except ValidationError as error:
            raise ValueError(f"invalid router settings: {error}") from error


def settings_table() -> str:
    """The Markdown knob table, generated from the field descriptions."""
    rows = ["| setting | env var | default | what it does |", "|---|---|---|---|"]
    for name, field in RouterSettings.model_fields.items():
        default = field.default if field.default not in ((), None) else "unset"
        rows.append(f"| `{name}` | `PDSERVE_{name.upper()}` | `{default}` | {field.description} |")
    return "\n".join(rows)
