"""Limits checked before a request is queued: its shape, and its tenant's caps.

Everything here is a 400 in OpenAI's shape, raised before any worker sees the request:
- at most ``max_messages`` messages, none (and no prompt string) over ``max_message_chars``;
- the model's caps (``max_prompt_tokens_by_model``, ``max_output_tokens_by_model``) and
  the tenant's (``max_prompt_tokens``, ``max_output_tokens`` in its policy).
And one default: a request without an output cap gets its model's ``default_max_tokens``,
or the lowest output cap when that is lower (a cap must hold for requests that name
none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.errors import InvalidRequest
from router.prepare.prepare import PreparedRequest
from router.settings import AdmissionSettings

OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens")  # chat's new name first, as vLLM


def check_shape(request: PreparedRequest, settings: AdmissionSettings) -> None:
    body = request.body
    if request.chat:
        messages = body.get("messages") or ()
        if len(messages) > settings.max_messages:
            raise InvalidRequest(
                f"{len(messages)} messages; at most {settings.max_messages} are accepted",
                param="messages", code="too_many_messages",
            )  # fmt: skip
        for i, message in enumerate(messages):
            if (
                isinstance(message, dict)
                and _chars(message.get("content")) > settings.max_message_chars
            ):
                raise _too_long(f"messages[{i}].content", settings.max_message_chars)
        return
    prompt = body.get("prompt")
    pieces = prompt if isinstance(prompt, list) else [prompt]
    if any(isinstance(p, str) and len(p) > settings.max_message_chars for p in pieces):
        raise _too_long("prompt", settings.max_message_chars)


def _chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    return 0


def _too_long(param: str, limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"{param} is over {limit} characters (max_message_chars)",
        param=param, code="message_too_long",
    )  # fmt: skip


def requested_output(body: dict[str, Any], *, chat: bool) -> int | None:
    """The request's own output cap, by the field vLLM reads on its endpoint."""
    for name in OUTPUT_FIELDS if chat else ("max_tokens",):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


@dataclass(frozen=True, slots=True)
class Caps:
    """Prompt and output caps, and whose they are: ``model`` or ``tenant`` (in the 400)."""

    owner: str
    prompt_tokens: int | None = None
    output_tokens: int | None = None


def apply_output_cap(
    request: PreparedRequest, caps: Sequence[Caps], default_max_tokens: int
) -> dict[str, Any] | None:
    """The body with the output cap a request without one gets, or None to keep it.

    Raises when the request asks for more than a cap allows."""
    asked = requested_output(request.body, chat=request.chat)
    if asked is not None:
        for cap in caps:
            if cap.output_tokens is not None and asked > cap.output_tokens:
                raise InvalidRequest(
                    f"max_tokens {asked} is over the {cap.owner}'s limit of {cap.output_tokens}",
                    param="max_tokens", code=f"{cap.owner}_output_limit",
                )  # fmt: skip
        return None
    limits = [c.output_tokens for c in caps if c.output_tokens] + [default_max_tokens]
    limits = [limit for limit in limits if limit]
    return {**request.body, "max_tokens": min(limits)} if limits else None


def check_prompt_cap(prompt_tokens: int, caps: Sequence[Caps], param: str) -> None:
    for cap in caps:
        if cap.prompt_tokens is not None and prompt_tokens > cap.prompt_tokens:
            raise InvalidRequest(
                f"the prompt has {prompt_tokens} tokens; the {cap.owner}'s limit is "
                f"{cap.prompt_tokens}",
                param=param, code=f"{cap.owner}_prompt_limit",
            )  # fmt: skip
