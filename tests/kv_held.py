"""A producer's held KV, freed by a consumer's refusal: one check for sims and vLLM."""

from __future__ import annotations

import asyncio
import time

import httpx

from kvtransfer.handoff import KVHandoff, parse_handoff
from loadgen.prometheus_text import scrape_or_none, total
from router.orchestration.engine_client import EngineClient
from router.orchestration.kv_release import KVReleases
from router.orchestration.orchestrate import prefill_body
from tests.conditions import until, wait_for


async def release(decode_url: str, model: str, handoff: KVHandoff) -> list[str]:
    """What the router does with a handoff no decode will pull; the outcomes counted."""
    engines = EngineClient(pool_size=4, connect_timeout_s=5, keepalive_s=30)
    outcomes: list[str] = []
    releases = KVReleases(engines, timeout_s=60, on_outcome=outcomes.append)
    releases.release(model, handoff, decode_url)
    try:
        await until(lambda: bool(outcomes), 120, "the release to end")
    finally:
        await releases.close()
        engines.close()
    return outcomes


def a_refused_handoff_frees_its_blocks(
    prefill_url: str, decode_url: str, model: str, freed_within_s: float
) -> None:
    """Prefill a prompt for a remote decode (the producer holds its blocks), have the
    router's ``KVReleases`` send the handoff to an idle decode engine inside a request it
    refuses, and see the producer's own KV usage back at idle within ``freed_within_s``,
    under its lease."""

    def used() -> float:
        samples = scrape_or_none(prefill_url + "/metrics", timeout_s=15)
        return float("inf") if samples is None else total(samples, "vllm:kv_cache_usage_perc")

    wait_for(lambda: used() == 0, 120, "the prefill engine to be idle")
    body = prefill_body({"model": model, "prompt": "held for a decode " * 40, "max_tokens": 8})
    answer = httpx.post(prefill_url + "/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    handoff = parse_handoff(answer.json()["kv_transfer_params"], issued_at_s=time.monotonic())
    assert used() > 0, "the producer holds the prompt's blocks for a decode"
    assert asyncio.run(release(decode_url, model, handoff)) == ["released"]
    wait_for(lambda: used() == 0, freed_within_s, "the producer to free the held blocks")
