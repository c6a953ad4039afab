"""A prefill-rate probe, run by the agent once its engine is ready and before it registers.

Admission predicts each request's time to first token from a curve fitted to the worker's
own prefills (``router.admission.ttft_predictor``). A new worker has none yet, and a fixed prior
rate was wrong by 2x or more on the first seconds of a burst (the admission benchmark's
misses). So the agent times a few prompts of distinct sizes, each starting with a nonce
(no prefix-cache hit), with ``max_tokens=1``, and reports (prompt tokens, seconds) in its
registration; the router seeds that worker's curve with them. Three sizes, because a
long prompt costs more per token than a short one (attention): two only give a line,
which forecasts long prompts early.

The probe has a time budget (``budget_s``, 10 s by default): registration waits on it,
and fixed sizes took 3.5 minutes on a slow CPU (issue 31). A short warm-up comes first,
unreported; then one prompt of ``first_words``; its time sets the other two sizes, the
largest that fit what is left of the budget (``plan_sizes``). A slow engine so reports
fewer or smaller sizes, a fast one the full range; whatever it reports, the router keeps
its prior until there is a curve, and admission never refuses for good on the prior
(``TTFTPredictor.measured``). A probe that fails reports what it measured before.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from dataclasses import dataclass

import aiohttp

log = logging.getLogger("pdserve.agent")

# Words of ordinary text: most tokenizers give each one token or two.
_WORDS = ("time", "water", "people", "number", "world", "house", "light", "river", "stone",
          "paper", "music", "north", "garden", "window", "market", "letter")  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbePlan:
    """The probe's knobs; the agent's ``--prefill-probe-budget-s`` sets ``budget_s``."""

    budget_s: float = 10.0
    warm_up_words: int = 16
    first_words: int = 128
    largest_words: int = 4096
    repeats: int = 2  # rounds over the sizes; a second round shows the noise

    def __post_init__(self) -> None:
        if self.budget_s <= 0 or self.repeats < 1 or self.first_words < 1:
            raise ValueError("a probe needs a positive budget, first size and repeats")


def probe_prompt(words: int) -> str:
    nonce = secrets.token_hex(8)
    return nonce + " " + " ".join(_WORDS[i % len(_WORDS)] for i in range(words))


def plan_sizes(plan: ProbePlan, first_s: float, left_s: float, limit_words: int) -> tuple[int, ...]:
    """The prompts (in words) still to time after the first, in order, so that they fit
    ``left_s`` at the first prompt's seconds per word (its fixed cost included, which
    overestimates the larger ones' linear part and leaves room for their square term).

    The largest size is halved until it fits, first with every round, then with one; a
    middle size sits halfway between (geometrically). Empty when even twice the first
    size does not fit: one size is no curve, and the router then keeps its prior."""
    per_word_s = max(first_s, 1e-6) / plan.first_words
    largest = min(plan.largest_words, limit_words)
    while largest >= 2 * plan.first_words:
        middle = round(math.sqrt(plan.first_words * largest))
        round_words = (plan.first_words, middle, largest)
        for repeats in sorted({plan.repeats, 1}, reverse=True):
            # The first round's first prompt is the one already timed.
            words = [*round_words[1:], *round_words * (repeats - 1)]
            if sum(words) * per_word_s <= left_s:
                return tuple(words)
        largest //= 2
    return ()


async def measure_prefill(
    engine_url: str,
    model: str,
    *,
    plan: ProbePlan | None = None,
    max_model_len: int | None = None,
) -> tuple[tuple[int, float], ...]:
    """(prompt tokens, seconds) per timed prompt; empty when the engine would not answer."""
    plan = plan or ProbePlan()
    limit = (max_model_len or 4096) // 4  # words: up to ~2.5 tokens each in small vocabularies
    samples: list[tuple[int, float]] = []
    started = time.perf_counter()
    try:
        # The hard stop: twice the budget, should the engine slow down mid-probe.
        async with asyncio.timeout(2 * plan.budget_s), aiohttp.ClientSession() as session:
            await _one(session, engine_url, model, min(plan.warm_up_words, limit))
            samples.append(await _one(session, engine_url, model, min(plan.first_words, limit)))
            left_s = plan.budget_s - (time.perf_counter() - started)
            for words in plan_sizes(plan, samples[0][1], left_s, limit):
                samples.append(await _one(session, engine_url, model, words))
    except (aiohttp.ClientError, TimeoutError, KeyError, TypeError, ValueError) as error:
        log.warning("prefill probe stopped after %d prompts: %r", len(samples), error)
    log.info("prefill probe: %d prompts in %.1fs", len(samples), time.perf_counter() - started)
    return tuple(samples)


async def _one(
    session: aiohttp.ClientSession, engine_url: str, model: str, words: int
) -> tuple[int, float]:
    body = {"model": model, "prompt": probe_prompt(words), "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    async with session.post(engine_url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        answer = await response.json()
    seconds = time.perf_counter() - started
    return int(answer["usage"]["prompt_tokens"]), round(seconds, 6)
