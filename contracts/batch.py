"""OpenAI's Files and Batch API objects, as the official SDK reads them.

- ``FileObject``: an uploaded file (``purpose="batch"``) or one a batch wrote
  (``"batch_output"``: its output and its error file alike, as OpenAI names both).
- ``Batch``: a batch's record. ``status`` moves validating -> in_progress ->
  finalizing -> completed, or to failed (its input file was refused, with ``errors``
  naming each line), expired (its ``completion_window`` ran out), cancelling ->
  cancelled. A batch whose every line failed is still ``completed``: the lines' own
  failures are in its error file.
- ``InputLine``/``OutputLine``: one request of the input JSONL and one line of the
  output or error file (``response`` for an HTTP answer, ``error`` for a line that got
  none: cancelled or expired before it ran).

``tenant`` on a file or batch is pdserve's own field: who may see it. It is never
answered to a client (``public()``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired",
    "cancelling", "cancelled",
]  # fmt: skip
ENDED: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
FilePurpose = Literal["batch", "batch_output"]


class _Owned(BaseModel):
    """A tenant's file or batch: ``tenant`` says whose, and is never answered."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = ""

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"tenant"})


class FileObject(_Owned):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None  # 1-based, in the input file


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(_Owned):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus = "validating"
    created_at: int
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None


class InputLine(BaseModel):
    """One request of a batch's input file, as validated."""

    model_config = ConfigDict(extra="forbid")

    custom_id: str = Field(min_length=1, max_length=512)
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


class LineResponse(BaseModel):
    status_code: int
    request_id: str
    body: Any


class LineError(BaseModel):
    code: str
    message: str


class OutputLine(BaseModel):
    id: str
    custom_id: str
    response: LineResponse | None = None
    error: LineError | None = None

    @property
    def succeeded(self) -> bool:
        return self.response is not None and 200 <= self.response.status_code < 300
