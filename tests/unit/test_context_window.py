"""The router refuses prompts the engines would refuse, with vLLM's rules and OpenAI's code."""

from __future__ import annotations

import pytest

from contracts.workers import WorkerRegistration, WorkerRole
from router.errors import InvalidRequest
from router.fleet.registry import WorkerState
from router.prepare.context_window import (
    check_prompt_chars,
    check_prompt_tokens,
    context_limit,
)


def worker(max_model_len: int | None) -> WorkerState:
    registration = WorkerRegistration(worker_id=f"w{max_model_len}", role=WorkerRole.PREFILL,
                                      model="m", engine_url="http://e",
                                      max_model_len=max_model_len)  # fmt: skip
    return WorkerState(registration, 0.0)


def test_the_pool_limit_is_its_smallest_worker_and_unknown_without_any():
    assert context_limit([worker(8192), worker(4096), worker(None)]) == 4096
    assert context_limit([worker(None)]) is None


def test_a_prompt_that_fits_passes_and_one_token_over_is_refused():
    check_prompt_tokens(4096, 4096, "prompt")
    with pytest.raises(InvalidRequest) as refused:
        check_prompt_tokens(4097, 4096, "messages")
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "messages")


def test_characters_beyond_what_the_limit_can_hold_are_refused_before_tokenizing():
    check_prompt_chars(4096 * 16, 4096, 16, "prompt")
    with pytest.raises(InvalidRequest, match="characters"):
        check_prompt_chars(4096 * 16 + 1, 4096, 16, "prompt")
