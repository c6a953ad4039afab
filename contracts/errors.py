"""OpenAI's error body, the one error shape pdserve returns anywhere."""

from __future__ import annotations

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
