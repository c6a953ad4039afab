"""Faults a sim can be told to show, at start (``--faults JSON``) or at run time
(``POST /sim/faults``): the failures the cluster must survive, on demand."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SimFaults(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    slowdown: float = Field(1.0, gt=0, le=10_000, description="Multiply every engine step's time.")
    hang: bool = Field(False, description="Stop stepping and stop answering /health.")
    crash: bool = Field(False, description="Die now, as if SIGKILLed (the agent restarts it).")
    transfer_failure_probability: float = Field(
        0.0, ge=0, le=1, description="Chance that a KV pull, as consumer, fails."
    )
    kv_event_drop_probability: float = Field(
        0.0, ge=0, le=1, description="Chance that a batch of KV events is never sent."
    )
