"""``pdserve sim calibrate`` recovers the timing of an engine whose timing is known: a sim."""

from __future__ import annotations

import dataclasses

import pytest
from aiohttp import web

from cli.ports import free_ports
from contracts.tokenization import load_tokenizer
from modelstore import tiny_llama
from sim.calibrate import fit_line, fit_profile, measure_sweep
from sim.profile import load_profile
from sim.server import SimConfig, SimServer


def test_fit_line_recovers_a_line():
    assert fit_line({1: 5.0, 3: 9.0, 5: 13.0}) == pytest.approx((3.0, 2.0))


async def test_calibrating_a_sim_recovers_its_profile():
    base = load_profile("tiny-cpu")
    # Slow enough that scheduling noise on a busy 2-core box stays small beside it.
    truth = dataclasses.replace(
        base, request_overhead_ms=30.0, floor_ms=15.0, prefill_ms_per_token=0.08,
        decode_ms_per_seq=2.0, prefill_ms_per_context=0.0, decode_ms_per_kv_ktoken=0.0,
    )  # fmt: skip
    (port,) = free_ports(1)
    model_dir = str(tiny_llama.ensure())
    config = SimConfig(model_dir=model_dir, served_model_name="m", port=port, profile=truth)
    runner = web.AppRunner(SimServer(config).app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        sweep = await measure_sweep(
            f"http://127.0.0.1:{port}", "m", repeats=1, say=lambda _: None,
            vocab_size=load_tokenizer(model_dir).vocab_size,
        )  # fmt: skip
    finally:
        await runner.cleanup()
    fitted = fit_profile(sweep, truth, name="fitted", source="test")
    assert fitted.prefill_ms_per_token == pytest.approx(truth.prefill_ms_per_token, rel=0.25)
    assert fitted.decode_ms_per_seq == pytest.approx(truth.decode_ms_per_seq, rel=0.25)
    assert fitted.floor_ms == pytest.approx(truth.floor_ms, rel=0.25)
    # The intercept also holds the HTTP round trip the sim does not model.
    assert fitted.request_overhead_ms == pytest.approx(truth.request_overhead_ms, abs=10)
