"""``pdserve sim calibrate``: measure a real engine and fit a timing profile to it.

Two sweeps, each on fresh prompts (a random token-id prefix defeats the prefix cache):
- prefill: one request at a time, ``max_tokens=1``, prompt lengths L. A sim's TTFT
  for that is ``request_overhead + floor + fresh_prefill_ms(L)``. The measured
  TTFT(L), less the step floor and the request overhead, becomes the profile's
  ``prefill_ms_curve`` (real vLLM on CPU is neither linear nor quadratic in L); a
  quadratic fitted to the same points gives the terms used past the curve and for
  attention over cached context;
- decode: c closed-loop, staggered streams of ``decode_tokens`` each; a sim's TPOT at batch c
  is ``floor + decode_ms_per_seq * c + decode_ms_per_kv_ktoken * context / 1000``,
  so a line fitted to TPOT(c), less the context term, gives floor and slope.
Terms these sweeps cannot separate (cached-context cost, KV size, transfer) keep
the base profile's values. Everything measured is written into the profile's
``notes``, so the fit can be checked by hand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from contracts.machine import describe, machine_record
from loadgen.client import RequestResult, stream_request
from sim.profile import TimingProfile

PREFILL_LENGTHS = (64, 128, 256, 512, 768, 1024, 1536, 2048)
DECODE_BATCHES = (1, 2, 4, 8)
DECODE_PROMPT_TOKENS = 64
DECODE_TOKENS = 64


@dataclass(frozen=True, slots=True)
class Sweep:
    prefill_ttft_ms: dict[int, float]  # prompt length -> median TTFT
    decode_tpot_ms: dict[int, float]  # concurrency -> median TPOT


def fresh_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    """Token ids no earlier prompt shares a first block with."""
    return [rng.randrange(100, vocab_size) for _ in range(length)]


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """Least squares (intercept, slope) through (x, y) points."""
    xs, ys = list(points), list(points.values())
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def fit_prefill(points: dict[int, float]) -> tuple[float, float, float]:
    """(intercept ms, ms per token, ms per 1000 attention pairs) from TTFT(prompt length).

    One unchunked prompt of L tokens attends L * L / 2 pairs. Fitted as a quadratic
    with non-negative terms; if the quadratic term comes out negative the line is kept.
    """
    import numpy as np

    lengths = np.array(list(points), dtype=float)
    ttft = np.array(list(points.values()), dtype=float)
    design = np.column_stack([np.ones_like(lengths), lengths, lengths * lengths / 2 / 1000])
    (intercept, per_token, per_kpair), *_ = np.linalg.lstsq(design, ttft, rcond=None)
    if per_kpair < 0 or per_token < 0:
        intercept, per_token = fit_line(points)
        per_kpair = 0.0
    return float(intercept), max(0.0, float(per_token)), float(per_kpair)


async def measure_sweep(
    url: str,
    model: str,
    *,
    vocab_size: int,
    repeats: int = 3,
    seed: int = 0,
    say: Callable[[str], None] = print,
) -> Sweep:
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(length: int, max_tokens: int) -> RequestResult:
            body = {"model": model, "prompt": fresh_prompt(rng, length, vocab_size),
                    "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}  # fmt: skip
            result = await stream_request(session, url + "/v1/completions", body)
            if not result.ok:
                raise RuntimeError(f"calibration request failed: {result.error}")
            if result.prompt_tokens not in (None, length):
                # A server that adds to the prompt (a template, a BOS) times other lengths.
                raise RuntimeError(f"calibration sent {length} prompt tokens and the server "
                                   f"counted {result.prompt_tokens}")  # fmt: skip
            return result

        await one(16, 2)  # warm-up: first-request costs are not the steady state
        prefill: dict[int, float] = {}
        for length in PREFILL_LENGTHS:
            ttfts = [(await one(length, 1)).ttft_s or 0.0 for _ in range(repeats)]
            prefill[length] = statistics.median(ttfts) * 1000
            say(f"  prefill  {length:5d} tokens: TTFT {prefill[length]:7.1f} ms")
        decode: dict[int, float] = {}
        for batch in DECODE_BATCHES:

            async def stream_worker(index: int, batch: int = batch) -> list[RequestResult]:
                # A first request of a different length per worker staggers the streams,
                # as real traffic is; lockstep streams time differently on vLLM CPU.
                await one(DECODE_PROMPT_TOKENS, max(2, DECODE_TOKENS * (index + 1) // batch))
                return [await one(DECODE_PROMPT_TOKENS, DECODE_TOKENS) for _ in range(repeats)]

            rounds = await asyncio.gather(*(stream_worker(i) for i in range(batch)))
            results = [r for worker_results in rounds for r in worker_results]
            decode[batch] = statistics.median(r.tpot_s or 0.0 for r in results) * 1000
            say(f"  decode   batch {batch:3d}: TPOT {decode[batch]:7.2f} ms")
    return Sweep(prefill_ttft_ms=prefill, decode_tpot_ms=decode)


def prefill_curve(points: dict[int, float], fixed_ms: float) -> tuple[tuple[int, float], ...]:
    """(L, TTFT(L) - fixed) for the measured lengths, made non-decreasing and >= 0.

    A shorter prompt never costs more than a longer one; a noisy sample that says
    so is raised to its predecessor rather than kept as a dip."""
    curve: list[tuple[int, float]] = []
    highest = 0.0
    for length in sorted(points):
        highest = max(highest, points[length] - fixed_ms)
        curve.append((length, round(highest, 3)))
    return tuple(curve)


def prefill_intercept_ms(points: dict[int, float]) -> float:
    """TTFT at zero tokens: the two shortest prompts' line, extended back to 0."""
    (short, short_ms), (longer, longer_ms) = sorted(points.items())[:2]
    slope = max(0.0, (longer_ms - short_ms) / (longer - short))
    return min(short_ms, max(0.0, short_ms - slope * short))


def fit_profile(sweep: Sweep, base: TimingProfile, *, name: str, source: str) -> TimingProfile:
    """The base profile with the step-time terms the sweep measures replaced."""
    mean_context = DECODE_PROMPT_TOKENS + DECODE_TOKENS / 2
    context_ms = {
        batch: base.decode_ms_per_kv_ktoken * batch * mean_context / 1000
        for batch in sweep.decode_tpot_ms
    }
    floor_ms, per_seq_ms = fit_line(
        {b: tpot - context_ms[b] for b, tpot in sweep.decode_tpot_ms.items()}
    )
    _, per_token_ms, per_kpair_ms = fit_prefill(sweep.prefill_ttft_ms)
    # The decode sweep measures the step floor; whatever a prompt's TTFT has beyond it
    # at zero tokens is per-request overhead. A prefill intercept below the floor
    # (noise in the extrapolation) means no overhead, never a smaller floor.
    floor_ms = max(0.1, floor_ms)
    overhead_ms = max(0.0, prefill_intercept_ms(sweep.prefill_ttft_ms) - floor_ms)
    return dataclasses.replace(
        base,
        name=name,
        source=source,
        floor_ms=round(floor_ms, 3),
        decode_ms_per_seq=round(max(0.0, per_seq_ms), 4),
        prefill_ms_per_token=round(per_token_ms, 5),
        prefill_ms_per_kpair=round(per_kpair_ms, 6),
        prefill_ms_curve=prefill_curve(sweep.prefill_ttft_ms, floor_ms + overhead_ms),
        request_overhead_ms=round(overhead_ms, 3),
    )


def write_profile(profile: TimingProfile, sweep: Sweep, path: Path) -> None:
    raw = dataclasses.asdict(profile)
    raw["notes"] = (
        "Fitted by `pdserve sim calibrate`. Median TTFT (ms) by prompt tokens: "
        + json.dumps(sweep.prefill_ttft_ms)
        + "; median TPOT (ms) by concurrent streams: "
        + json.dumps(sweep.decode_tpot_ms)
        + ". Not fitted (kept from the base profile): prefill_ms_per_context, "
        "decode_ms_per_kv_ktoken, KV size and transfer terms. Measured on "
        + describe(machine_record())
        + "."
    )
    path.write_text(json.dumps(raw, indent=2) + "\n")
