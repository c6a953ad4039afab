"""The model registry's records and a model's route: which version serves which stage.

- ``ModelArtifact``: one registered version of a model, immutable once registered.
- ``RouteSpec``: per model id, the ``prod`` version, an optional ``canary`` (a weight and
  a stickiness key) and ``shadow`` (a sample rate), the SLO gate a canary must pass to be
  promoted, and whether a reviewer must approve it first.

Clients name a model id; the route picks the version. Versions never reach the client.
Checks that need the registry (a version exists) and the stages being distinct live in
``router.rollout``; what a field alone can say wrong is refused here, naming the field.
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


class RouteSpec(BaseModel):
    """``PUT /admin/v1/routes/{model_id}``'s body, and the route as stored."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prod: str = Field(pattern=_NAME)
    canary: CanaryStage | None = None
    shadow: ShadowStage | None = None
    gate: SloGate = Field(default_factory=SloGate)
    requires_approval: bool = Field(
        False, description="promotion needs a reviewer's approval of the canary version"
    )
    safety: SafetyPolicy = Field(default_factory=SafetyPolicy)

    def versions(self) -> dict[str, str]:
        """stage -> version, for the stages set."""
        named = {"prod": self.prod}
        if self.canary is not None:
            named["canary"] = self.canary.version
        if self.shadow is not None:
            named["shadow"] = self.shadow.version
        return named


Decision = Literal["approve", "refuse"]


class Approval(BaseModel):
    """A reviewer's decision on a version for prod (``POST .../approve``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = Field(pattern=_NAME)
    decision: Decision = "approve"
    note: str = Field("", max_length=2000)
