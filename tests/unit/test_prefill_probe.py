"""The agent's prefill probe fits its time budget: sizes chosen from the first sample."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from agent.prefill_probe import ProbePlan, measure_prefill, plan_sizes
from tests.completions_server import completions_server

PLAN = ProbePlan(budget_s=10.0, first_words=128, largest_words=4096, repeats=2)


@pytest.mark.parametrize(
    ("first_s", "left_s", "limit", "expected"),
    [
        # A fast engine (2 ms/word) under a 1024-word context: the full range, twice.
        (0.25, 9.0, 1024, (362, 1024, 128, 362, 1024)),
        # The same with room for 4096 words: a wider range once beats a narrower twice.
        (0.25, 9.0, 4096, (512, 2048)),
        # Slower (20 ms/word): 4096 words do not fit, nor twice 1024; once does.
        (2.5, 40.0, 4096, (362, 1024)),
        # The AVX2 box in bf16 (~30 tokens/s): one size is all there is time for.
        (5.0, 4.0, 4096, ()),
    ],
)
def test_sizes_fit_what_is_left_of_the_budget(first_s, left_s, limit, expected):
    sizes = plan_sizes(PLAN, first_s, left_s, limit)
    assert sizes == expected
    assert sum(sizes) * first_s / PLAN.first_words <= left_s


def test_the_largest_fitting_range_is_preferred_to_a_second_round():
    per_word_s = 0.001
    sizes = plan_sizes(PLAN, 128 * per_word_s, 5.0, 4096)
    assert max(sizes) == 4096 and len(sizes) == 2  # 4096 once before 2048 twice
    assert sum(sizes) * per_word_s <= 5.0
    assert len(set(sizes) | {128}) == 3  # three distinct sizes: the curve's square shows


def test_a_bad_plan_is_refused():
    with pytest.raises(ValueError):
        ProbePlan(budget_s=0)


@pytest.mark.parametrize(("seconds_per_word", "prompts"), [(0.0002, 6), (0.02, 1)])
def test_the_probe_ends_within_its_budget(seconds_per_word, prompts):
    """Against an endpoint whose prefill takes time in proportion to the words."""

    async def completions(request: web.Request) -> web.Response:
        words = len((await request.json())["prompt"].split())
        await asyncio.sleep(words * seconds_per_word)
        return web.json_response({"usage": {"prompt_tokens": words}})

    async def probe() -> tuple[tuple[int, float], ...]:
        async with completions_server(completions) as url:
            return await measure_prefill(url, "m", plan=ProbePlan(budget_s=3.0),
                                         max_model_len=4096)  # fmt: skip

    started = time.perf_counter()
    samples = asyncio.run(probe())
    assert time.perf_counter() - started < 3.0 + 1.0
    assert len(samples) == prompts
    assert samples[0][0] == 128 + 1  # the nonce, then the first size's words
