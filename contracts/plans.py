"""The SLO planner's plan for one model, as it publishes it (``PUT /admin/v1/plans/{model}``)
and as the status view and ``GET /admin/v1/plans`` show it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FleetPlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    mode: Literal["recommend", "apply"]
    prefill: int = Field(ge=1, description="prefill workers the planner wants")
    decode: int = Field(ge=1, description="decode workers the planner wants")
    current_prefill: int = Field(ge=0)
    current_decode: int = Field(ge=0)
    reason: str = Field(max_length=500, description="why, in one sentence")
    forecast_rate_per_s: float = Field(ge=0)
    predicted_attainment: float = Field(ge=0, le=1)
    measured_attainment: float | None = Field(None, ge=0, le=1, description="last interval")
    usd_per_hour: float = Field(ge=0)
    decided_unix_s: float
    applied: bool = Field(False, description="the planner asked the ratio API for it")
