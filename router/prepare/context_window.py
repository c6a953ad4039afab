"""Context-length guard: refuse what the engines would refuse, before it costs anything.

vLLM (0.32) answers 400 when a prompt has more tokens than ``--max-model-len``, and
refuses before tokenizing a prompt of more characters than its longest token's
length times the limit; an output cap beyond the context left is clamped, not
refused. The router applies the same rules with the limit its workers registered, so
an oversized prompt is neither tokenized at length by the router nor sent to a
prefill worker: context-length abuse costs the client a 400, not the pool its
prefill time.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.errors import InvalidRequest
from router.fleet.registry import WorkerState

CODE = "context_length_exceeded"  # OpenAI's code for this error


def context_limit(workers: Sequence[WorkerState]) -> int | None:
    """The smallest max_model_len the pool registered: a prompt must fit any worker."""
    limits = [w.registration.max_model_len for w in workers if w.registration.max_model_len]
    return min(limits, default=None)


def check_prompt_chars(chars: int, limit: int, max_chars_per_token: int, param: str) -> None:
    if chars > limit * max_chars_per_token:
        raise InvalidRequest(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {chars} characters (more than {limit * max_chars_per_token}, the most "
            f"that {limit} tokens can hold). Please reduce the length of the input.",
            param=param,
            code=CODE,
        )


def check_prompt_tokens(prompt_tokens: int, limit: int, param: str) -> None:
    if prompt_tokens > limit:
        raise InvalidRequest(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {prompt_tokens} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input.",
            param=param,
            code=CODE,
        )
