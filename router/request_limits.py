"""Limits checked before a request is queued: its shape, and its tenant's caps.

Everything here is a 400 in OpenAI's shape, raised before any worker sees the request:
- at most ``max_messages`` messages, none (and no prompt string) over ``max_message_chars``;
- the tenant's ``max_prompt_tokens`` and ``max_output_tokens``.
And one default: a request without an output cap gets its model's ``default_max_tokens``,
or its tenant's cap when that is lower (a tenant's cap must hold for requests that name
none).
"""

from __future__ import annotations

from typing import Any

from router.errors import InvalidRequest
from router.prepare import PreparedRequest
from router.settings import AdmissionSettings
from router.tenants import Tenant

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


def requested_output(body: dict[str, Any]) -> int | None:
    for name in OUTPUT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def apply_output_cap(
    request: PreparedRequest, tenant: Tenant, default_max_tokens: int
) -> dict[str, Any] | None:
    """The body with the output cap a request without one gets, or None to keep it.

    Raises when the request asks for more than its tenant's cap."""
    cap = tenant.policy.max_output_tokens
    asked = requested_output(request.body)
    if asked is not None:
        if cap is not None and asked > cap:
            raise InvalidRequest(
                f"max_tokens {asked} is over this API key's limit of {cap}",
                param="max_tokens", code="tenant_output_limit",
            )  # fmt: skip
        return None
    defaults = [d for d in (default_max_tokens or None, cap) if d]
    if not defaults:
        return None
    return {**request.body, "max_tokens": min(defaults)}


def check_prompt_cap(prompt_tokens: int, tenant: Tenant, param: str) -> None:
    cap = tenant.policy.max_prompt_tokens
    if cap is not None and prompt_tokens > cap:
        raise InvalidRequest(
            f"the prompt has {prompt_tokens} tokens; this API key may send at most {cap}",
            param=param, code="tenant_prompt_limit",
        )  # fmt: skip
