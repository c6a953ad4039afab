"""A prefill-rate probe, run by the agent once its engine is ready and before it registers.

Admission predicts each request's time to first token from a line fitted to the worker's
own prefills (``router.ttft_predictor``). A new worker has none yet, and a fixed prior
rate was wrong by 2x or more on the first seconds of a burst (the admission benchmark's
misses). So the agent times a few prompts of distinct sizes, each starting with a nonce
(no prefix-cache hit), with ``max_tokens=1``, and reports (prompt tokens, seconds) in its
registration; the router seeds that worker's curve with them. Three sizes, because a
long prompt costs more per token than a short one (attention): two only give a line,
which forecasts long prompts early.

The first call warms the engine up and is not reported. A probe that fails reports
nothing: the router then keeps its prior for the worker.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

import aiohttp

log = logging.getLogger("pdserve.agent")

# Words of ordinary text: most tokenizers give each one token or two.
_WORDS = ("time", "water", "people", "number", "world", "house", "light", "river", "stone",
          "paper", "music", "north", "garden", "window", "market", "letter")  # fmt: skip


def probe_prompt(words: int) -> str:
    nonce = secrets.token_hex(8)
    return nonce + " " + " ".join(_WORDS[i % len(_WORDS)] for i in range(words))


async def measure_prefill(
    engine_url: str,
    model: str,
    *,
    sizes_words: tuple[int, ...] = (128, 1024, 4096),
    repeats: int = 2,
    max_model_len: int | None = None,
    timeout_s: float = 60.0,
) -> tuple[tuple[int, float], ...]:
    """(prompt tokens, seconds) per probe; empty when the engine would not answer."""
    limit = (max_model_len or 4096) // 4  # words: up to ~2.5 tokens each in small vocabularies
    sizes = [min(size, limit) for size in sizes_words]
    samples: list[tuple[int, float]] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await _one(session, engine_url, model, sizes[0])  # warm-up, not reported
            for _ in range(repeats):
                for size in sizes:
                    samples.append(await _one(session, engine_url, model, size))
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, TypeError, ValueError) as error:
        log.warning("prefill probe failed, the router keeps its prior: %r", error)
        return ()
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
