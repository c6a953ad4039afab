"""What the router answers, for ``/openapi.json``: OpenAI's response, stream-chunk and
error shapes. Documentation only: answers are the engine's bytes, relayed (the router
never re-encodes them), so these models describe and never validate."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(examples=["invalid_request_error"])
    param: str | None = None
    code: str | None = Field(None, examples=["context_length_exceeded"])


class ErrorResponse(BaseModel):
    """OpenAI's error shape, on every 4xx and 5xx (and in a stream's ``event: error``)."""

    error: ErrorDetail


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(_Open):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class CompletionResponse(_Open):
    id: str = Field(examples=["cmpl-<X-Request-Id>"])
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(_Open):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(_Open):
    index: int
    message: AssistantMessage
    finish_reason: str | None = None


class ChatCompletionResponse(_Open):
    id: str = Field(examples=["chatcmpl-<X-Request-Id>"])
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(_Open):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(_Open):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None


class ChatCompletionChunk(_Open):
    """One ``data:`` event of a chat stream; the stream ends with ``data: [DONE]``. With
    ``stream_options.include_usage`` the last chunk has empty choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunk(_Open):
    """One ``data:`` event of a completion stream; the stream ends with ``data: [DONE]``."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Open):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Embedding(_Open):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class EmbeddingUsage(_Open):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(_Open):
    id: str
    object: Literal["list"] = "list"
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage
