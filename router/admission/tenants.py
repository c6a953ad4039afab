"""Tenants: who is calling, by API key, and the policy that caller is admitted under.

A tenant is a name with API keys, request and token rates, a priority class, a fair-share
weight, the models it may use (a 403 for others; ``/v1/models`` lists only those) and its
own context and output caps (``tenants`` knob, JSON). A key no tenant
names is a tenant of its own, named by a digest of the key (the key itself is never
logged or exported); without client keys every caller is ``anonymous``. Both get the
default rates.

Priority classes, highest first: ``interactive``, ``standard``, ``batch``. A request may
ask for a lower class than its tenant's with ``x-pdserve-priority``, never a higher one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PRIORITIES = ("interactive", "standard", "batch")  # highest first
Priority = Literal["interactive", "standard", "batch"]
ANONYMOUS = "anonymous"


class TenantPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    keys: tuple[str, ...] = ()
    rpm: float = Field(0, ge=0, description="requests per minute; 0: no limit")
    tpm: float = Field(0, ge=0, description="prompt + max_tokens per minute; 0: no limit")
    priority: Priority = "standard"
    weight: float = Field(1.0, gt=0, le=1000, description="fair share within its class")
    max_prompt_tokens: int | None = Field(None, ge=1)
    max_output_tokens: int | None = Field(None, ge=1)
    models: tuple[str, ...] = Field(
        (), max_length=1000, description="model ids (or aliases) it may use; empty: all"
    )


def parse_tenants(spec: str) -> dict[str, TenantPolicy]:
    """The ``tenants`` knob; raises ValueError naming what is wrong (keys never echoed)."""
    if not spec.strip():
        return {}
    try:
        raw = json.loads(spec)
    except ValueError as error:
        raise ValueError(f"tenants: not JSON ({error.msg} at {error.pos})") from None
    if not isinstance(raw, dict):
        raise ValueError("tenants: a JSON object of name -> policy")
    policies: dict[str, TenantPolicy] = {}
    owner: dict[str, str] = {}
    for name, policy in raw.items():
        try:
            policies[name] = TenantPolicy.model_validate(policy)
        except ValidationError as error:
            fields = ", ".join(".".join(map(str, e["loc"])) for e in error.errors())
            raise ValueError(f"tenants: {name!r} has invalid fields: {fields}") from None
        for key in policies[name].keys:
            if key in owner:
                raise ValueError(f"tenants: {name!r} and {owner[key]!r} share an API key")
            owner[key] = name
    return policies


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    policy: TenantPolicy

    def may_use(self, requested: str, served: str) -> bool:
        allowed = self.policy.models
        return not allowed or requested in allowed or served in allowed

    def priority_for(self, asked: str | None) -> int:
        """The class index (0 is highest) this request runs in: the tenant's, or lower."""
        own = PRIORITIES.index(self.policy.priority)
        if asked not in PRIORITIES:
            return own
        return max(own, PRIORITIES.index(asked))


class Tenants:
    def __init__(self, policies: Mapping[str, TenantPolicy], *, default: TenantPolicy) -> None:
        self._by_key = {key: Tenant(name, p) for name, p in policies.items() for key in p.keys}
        self._default = default
        self._anonymous = Tenant(ANONYMOUS, default)

    def __repr__(self) -> str:
        return f"Tenants(keys={len(self._by_key)})"

    def keys(self) -> frozenset[str]:
        return frozenset(self._by_key)

    def named(self, name: str) -> Tenant:
        """The tenant ``identify`` named so (a batch runs as its creator): a configured
        tenant's policy, else the default one's."""
        if name == ANONYMOUS:
            return self._anonymous
        found = next((t for t in self._by_key.values() if t.name == name), None)
        return found or Tenant(name, self._default)

    def identify(self, api_key: str | None) -> Tenant:
        if api_key is None:
            return self._anonymous
        tenant = self._by_key.get(api_key)
        if tenant is not None:
            return tenant
        digest = hashlib.sha256(api_key.encode()).hexdigest()[:12]
        return Tenant(f"key-{digest}", self._default)
