"""The model registry's records and a model's route: which version serves which stage.

- ``ModelArtifact``: one registered version of a model, immutable once registered.
- ``RouteSpec``: per model id, the ``prod`` version, an optional ``canary`` (a weight and
  a stickiness key) and ``shadow`` (a sample rate), and the SLO gate a canary must pass to
  be promoted. Operators write it.
- ``ModelPolicy``: per model id, what reviewers decide: whether versions need a
  reviewer's approval before they serve prod traffic (or canary traffic above a weight),
  and the safety checks. Operators may only tighten it (``loosened_by``).

Clients name a model id; the route picks the version. Versions never reach the client.
Checks that need the registry (a version exists) and the stages being distinct live in
``router.rollout.rollout``; what a field alone can say wrong is refused here, naming the field.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.safety import SafetyPolicy

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$"
_CHECKSUM = re.compile(r"^(sha256:[0-9a-f]{64}|[a-z0-9]+:[0-9A-Za-z._\-]{8,128})$")


class ModelArtifact(BaseModel):
    """One version of a model, as registered by an operator."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str = Field(pattern=_NAME, description="what clients ask for")
    version: str = Field(pattern=_NAME)
    artifact: str = Field(
        min_length=1, max_length=1000,
        description="a local folder or file, or a URI (hf://, s3://, gs://, https://)",
    )  # fmt: skip
    max_context: int = Field(ge=1, le=10_000_000, description="prompt + output tokens")
    tokenizer: str = Field(min_length=1, max_length=1000, description="folder or hub id")
    checksum: str = Field(description="`sha256:<hex>`, or `<algo>:<digest>`")

    @field_validator("checksum")
    @classmethod
    def _checksum_shape(cls, value: str) -> str:
        if not _CHECKSUM.match(value):
            raise ValueError("checksum must be `sha256:<64 hex>` or `<algo>:<digest>`")
        return value


class RegisteredArtifact(ModelArtifact):
    registered_at_unix_s: float
    registered_by: str


StickinessKey = Literal["api_key", "user", "header"]


class CanaryStage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = Field(pattern=_NAME)
    weight: float = Field(ge=0.0, le=1.0, description="share of the model's keys")
    stickiness: StickinessKey = Field(
        "api_key",
        description="what keeps a caller on one side: the API key, the body's `user`, or "
        "the header named in `sticky_header`",
    )
    sticky_header: str | None = Field(None, pattern=r"^[A-Za-z0-9\-]{1,64}$")
    prepull_workers: int = Field(
        0, ge=0, le=1000,
        description="pull the canary's version into this many workers' node caches "
        "first, and send it no traffic until that many report it pulled (0: no pre-pull)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _header_named(self) -> CanaryStage:
        if self.stickiness == "header" and not self.sticky_header:
            raise ValueError("stickiness `header` needs `sticky_header`")
        return self


class ShadowStage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = Field(pattern=_NAME)
    sample_rate: float = Field(ge=0.0, le=1.0, description="share of requests mirrored")


class SloGate(BaseModel):
    """What a canary must show against prod, over this router's last ``window_s``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_s: float = Field(300.0, gt=0, le=86_400)
    min_requests: int = Field(50, ge=1, le=1_000_000, description="per side, to judge at all")
    max_ttft_p99_ratio: float = Field(1.5, gt=0, description="canary p99 / prod p99")
    max_itl_p99_ratio: float = Field(1.5, gt=0, description="canary p99 / prod p99")
    max_error_rate_delta: float = Field(
        0.02, ge=0, le=1, description="canary error rate - prod error rate"
    )
    auto_rollback: bool = Field(True, description="roll a breaching canary back by itself")


_POLICY_FIELDS = ("requires_approval", "safety")


class RouteSpec(BaseModel):
    """``PUT /admin/v1/routes/{model_id}``'s body, and the route as stored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prod: str = Field(pattern=_NAME)
    canary: CanaryStage | None = None
    shadow: ShadowStage | None = None
    gate: SloGate = Field(default_factory=SloGate)

    @model_validator(mode="before")
    @classmethod
    def _policy_is_not_the_routes(cls, value: object) -> object:
        # A route once carried these; now a reviewer owns them, so say where they went.
        moved = [name for name in _POLICY_FIELDS if isinstance(value, dict) and name in value]
        if moved:
            raise ValueError(
                f"{', '.join(moved)} belong to the model's policy: "
                "PUT /admin/v1/policies/{model_id} (loosening it needs a reviewer)"
            )
        return value

    def versions(self) -> dict[str, str]:
        """stage -> version, for the stages set."""
        named = {"prod": self.prod}
        if self.canary is not None:
            named["canary"] = self.canary.version
        if self.shadow is not None:
            named["shadow"] = self.shadow.version
        return named


class ModelPolicy(BaseModel):
    """``PUT /admin/v1/policies/{model_id}``'s body: the reviewers' part of a model.

    With ``requires_approval``, a version serves prod traffic only once a reviewer
    approved it, and canary traffic above ``max_unapproved_canary_weight`` likewise; with
    no route, only approved versions serve. Shadow copies are never answered to a client,
    so a shadow needs no approval.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    requires_approval: bool = Field(
        False, description="a version serves prod (and a heavy canary) only once approved"
    )
    max_unapproved_canary_weight: float = Field(
        0.1, ge=0.0, le=1.0,
        description="with requires_approval: the largest canary weight an unapproved "
        "version may take",
    )  # fmt: skip
    safety: SafetyPolicy = Field(default_factory=SafetyPolicy)

    def needs_approval(self, stage: str, weight: float = 1.0) -> bool:
        """Whether a version must be approved to serve ``stage`` at ``weight``."""
        if not self.requires_approval or stage == "shadow":
            return False
        return stage == "prod" or weight > self.max_unapproved_canary_weight

    def loosened_by(self, new: ModelPolicy) -> list[str]:
        """How ``new`` is looser than this policy (empty: as strict or stricter).

        Stricter means: approval stays on (or is turned on), the unapproved canary weight
        does not rise, and every current check is kept unchanged (checks may be added).
        Anything else, a reworded pattern included, counts as loosening: judging whether
        an edited check is weaker is a reviewer's call, not the router's.
        """
        looser = []
        if self.requires_approval and not new.requires_approval:
            looser.append("requires_approval turned off")
        if new.max_unapproved_canary_weight > self.max_unapproved_canary_weight:
            looser.append("max_unapproved_canary_weight raised")
        kept = {check.name: check for check in new.safety.checks}
        for check in self.safety.checks:
            if kept.get(check.name) != check:
                looser.append(f"safety check {check.name!r} removed or changed")
        old_rest = self.safety.model_dump(exclude={"checks"})
        if new.safety.model_dump(exclude={"checks"}) != old_rest:
            looser.append("safety settings changed (keep_prompt, retention, lookback)")
        return looser


Decision = Literal["approve", "refuse"]


class Approval(BaseModel):
    """A reviewer's decision on a version for prod (``POST .../approve``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = Field(pattern=_NAME)
    decision: Decision = "approve"
    note: str = Field("", max_length=2000)
