"""Validation of client requests at the boundary.

The models check what the router relies on and what would waste a worker if
wrong; every other field (vLLM's sampling extras) passes through untouched.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from router.errors import InvalidRequest


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    # Chat's name for max_tokens; on /v1/completions vLLM ignores it, but the router reads
    # the field, so its type is checked on both.
    max_completion_tokens: int | None = Field(None, ge=1)
    # n > 1 and prompt lists are served one call per choice (router/prepare/fan_out.py).
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    kv_transfer_params: None = Field(None, description="set by the router, never by clients")


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, prompt: Any) -> Any:
        if not prompt:
            raise ValueError("prompt must not be empty")
        return prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1, max_length=64)
    content: str | list[Any] | None = None


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)


class EmbeddingRequest(BaseModel):
    """``/v1/embeddings``: the fields the router reads. vLLM checks the rest (an empty
    input, ``dimensions`` on a model without them, its extras such as
    ``truncate_prompt_tokens``) and its errors pass through as it answers them."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    input: str | list[str] | list[int] | list[list[int]]
    stream: Literal[False] = False
    kv_transfer_params: None = Field(None, description="set by the router, never by clients")


ClientRequest = GenerationRequest | EmbeddingRequest


def validate(model: type[ClientRequest], body: Any, *, max_tokens_cap: int) -> ClientRequest:
    """Validate ``body`` or raise ``InvalidRequest`` naming the first bad field."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        request = model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if param == "kv_transfer_params":
            raise InvalidRequest(
                "kv_transfer_params is set by the router; remove it", param=param
            ) from None
        raise InvalidRequest(f"{param}: {first['msg']}", param=param) from None
    if getattr(request, "stream_options", None) is not None and not request.stream:
        raise InvalidRequest(
            "stream_options is only allowed with stream=true", param="stream_options"
        )
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(request, name, None)
        if value is not None and value > max_tokens_cap:
            raise InvalidRequest(f"{name} must be at most {max_tokens_cap}", param=name)
    return request
