"""The observability numbers on real vLLM + NIXL: the decode pool's KV transfers come
from vLLM's own nixl_* metrics through the agents' heartbeats, a decode's pulled prompt
counts as a prefix hit, the engines' memory is measured, and the router's token counters
match the usage the client got."""

from __future__ import annotations

from loadgen.prometheus_text import scrape, total
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import generate


def test_kv_transfers_prefix_hits_memory_and_tokens_on_real_engines(router_url):
    metrics = router_url + "/metrics"
    before = scrape(metrics)
    usage_in = usage_out = 0
    for i in range(3):
        body = {"model": MODEL, "prompt": f"observability on real engines {i} " * 20,
                "max_tokens": 4, "temperature": 0}  # fmt: skip
        answer = generate(router_url, "/v1/completions", body)
        assert answer.status == 200
        usage_in += answer.usage["prompt_tokens"]
        usage_out += answer.usage["completion_tokens"]

    def transfers() -> float:
        return total(scrape(metrics), "pdserve_kv_transfers_total", pool="decode") - total(
            before, "pdserve_kv_transfers_total", pool="decode"
        )

    wait_for(lambda: transfers() >= 3, 30, "the decode's NIXL transfers in a heartbeat")
    after = scrape(metrics)
    grown_bytes = total(after, "pdserve_kv_transfer_bytes_total", pool="decode") - total(
        before, "pdserve_kv_transfer_bytes_total", pool="decode"
    )
    assert grown_bytes > 0

    def grown(name: str) -> float:
        return total(after, name, pool="decode") - total(before, name, pool="decode")

    # The decode computed almost nothing itself: its prompt arrived over NIXL, a hit.
    found = grown("pdserve_pool_prefix_cache_hits_total") + grown(
        "pdserve_pool_external_prefix_cache_hits_total"
    )
    assert found > 0.5 * grown("pdserve_pool_prefix_cache_queries_total") > 0
    assert total(after, "pdserve_worker_engine_memory_bytes", worker="decode-0") > 100 * 2**20
    grew_in = total(after, "pdserve_prompt_tokens_total", model=MODEL) - total(
        before, "pdserve_prompt_tokens_total", model=MODEL
    )
    grew_out = total(after, "pdserve_generation_tokens_total", model=MODEL) - total(
        before, "pdserve_generation_tokens_total", model=MODEL
    )
    assert (grew_in, grew_out) == (usage_in, usage_out)


def test_each_engines_start_is_reported_in_its_parts(router_url):
    """vLLM's weight load and warm-up split out of the start (agent.start_phases), and
    the agent's probe: all there, and the parts of a start no larger than the whole of it
    as vLLM's own log times it."""
    samples = scrape(router_url + "/metrics")
    for worker, role in (("prefill-0", "prefill"), ("decode-0", "decode")):
        phase = {
            name: total(samples, "pdserve_worker_start_seconds", worker=worker, phase=name)
            for name in ("process_start", "weights_load", "engine_warm_up", "probe")
        }
        assert phase["weights_load"] > 0 and phase["engine_warm_up"] > 0, (worker, phase)
        assert phase["process_start"] > 0, (worker, phase)
        assert total(samples, "pdserve_worker_start_seconds", worker=worker,
                     phase="engine_start") == 0  # fmt: skip
        assert (phase["probe"] > 0) == (role == "prefill")  # decode is not probed
