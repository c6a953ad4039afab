"""Limits before queueing: message shape, model and tenant caps, the default output cap."""

from __future__ import annotations

import pytest

from router.admission.request_limits import Caps, apply_output_cap, check_prompt_cap, check_shape
from router.errors import InvalidRequest
from router.prepare.prepare import Endpoint, PreparedRequest
from router.settings import AdmissionSettings


def request(body: dict, endpoint: Endpoint = Endpoint.COMPLETIONS) -> PreparedRequest:
    return PreparedRequest(endpoint=endpoint, body=body, model="m", stream=False,
                           arrived_s=0.0, requested_model="m")  # fmt: skip


def code_of(call) -> str:
    with pytest.raises(InvalidRequest) as refused:
        call()
    return refused.value.code


def test_message_count_and_size_are_capped():
    settings = AdmissionSettings(max_messages=2, max_message_chars=10)
    chat = Endpoint.CHAT
    check_shape(request({"messages": [{"role": "user", "content": "x" * 10}] * 2}, chat), settings)
    three = request({"messages": [{"role": "user", "content": "x"}] * 3}, chat)
    assert code_of(lambda: check_shape(three, settings)) == "too_many_messages"
    parts = [{"type": "text", "text": "x" * 6}, {"type": "text", "text": "y" * 5}]
    long_parts = request({"messages": [{"role": "user", "content": parts}]}, chat)
    assert code_of(lambda: check_shape(long_parts, settings)) == "message_too_long"
    long_prompt = request({"prompt": ["short", "x" * 11]})
    assert code_of(lambda: check_shape(long_prompt, settings)) == "message_too_long"


def test_the_stricter_of_the_model_and_tenant_caps_holds():
    caps = (Caps("model", prompt_tokens=1000, output_tokens=64), Caps("tenant", 500, None))
    check_prompt_cap(500, caps, "prompt")
    assert code_of(lambda: check_prompt_cap(501, caps, "prompt")) == "tenant_prompt_limit"
    assert apply_output_cap(request({"max_tokens": 64}), caps, 0) is None
    assert code_of(lambda: apply_output_cap(request({"max_tokens": 65}), caps, 0)) == (
        "model_output_limit"
    )


def test_a_request_without_an_output_cap_gets_the_lowest_of_the_default_and_the_caps():
    caps = (Caps("model", None, 64), Caps("tenant", None, 32))
    assert apply_output_cap(request({"prompt": "x"}), caps, 100) == {
        "prompt": "x",
        "max_tokens": 32,
    }
    assert apply_output_cap(request({"prompt": "x"}), (), 100)["max_tokens"] == 100
    # No default and no cap: vLLM's rule (the rest of the context) stays.
    assert apply_output_cap(request({"prompt": "x"}), (Caps("model"),), 0) is None
    # max_completion_tokens is a chat request's own cap; /v1/completions reads max_tokens.
    chat = request({"max_completion_tokens": 8}, Endpoint.CHAT)
    assert apply_output_cap(chat, caps, 100) is None
    assert apply_output_cap(request({"max_completion_tokens": 8}), caps, 100)["max_tokens"] == 32
