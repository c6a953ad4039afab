"""Conditional disaggregation on a small sim cluster of its own (1 prefill, 2 decode).

A prompt whose uncached part is short is prefilled on the decode worker, skipping the
transfer; a long one goes through P/D; a later chat turn goes back to the decode
worker that holds its prefix (a decode-side hit) and is served there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster
from modelstore import tiny_llama
from tests.clusters import small_sim_cluster
from tests.generation import generate

MODEL = tiny_llama.SERVED_NAME
THRESHOLD = 200  # tokens; tiny-cpu's block is 128


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with small_sim_cluster(
        tmp_path_factory.mktemp("conditional"), decode=2,
        router_env={"PDSERVE_CONDITIONAL_DISAGG_MAX_UNCACHED_TOKENS": str(THRESHOLD)},
    ) as local:  # fmt: skip
        yield local


def tokens_by_source(cluster: LocalCluster, worker: str, source: str) -> float:
    samples = scrape(cluster.worker(worker).engine_url + "/metrics")
    return total(samples, "vllm:prompt_tokens_by_source_total", source=source)


def decisions(cluster: LocalCluster, pool: str) -> float:
    return total(scrape(cluster.router_url + "/metrics"), "pdserve_routing_decisions_total",
                 pool=pool)  # fmt: skip


def complete(cluster: LocalCluster, prompt: list[int]) -> None:
    result = generate(cluster.router_url, "/v1/completions",
                      {"model": MODEL, "prompt": prompt, "max_tokens": 3})  # fmt: skip
    assert result.status == 200, result.body


def snapshot(cluster: LocalCluster) -> dict[tuple[str, str], float]:
    return {
        (w.name, source): tokens_by_source(cluster, w.name, source)
        for w in cluster.workers
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }


def gained(cluster: LocalCluster, before: dict, source: str) -> dict[str, float]:
    now = snapshot(cluster)
    return {w: now[(w, s)] - before[(w, s)] for (w, s) in now if s == source and
            now[(w, s)] > before[(w, s)]}  # fmt: skip


def test_a_short_prompt_is_prefilled_on_the_decode_worker(cluster):
    before, prefills = snapshot(cluster), decisions(cluster, "prefill")
    complete(cluster, list(range(300, 300 + 50)))
    assert decisions(cluster, "prefill") == prefills, "no prefill worker was asked"
    assert gained(cluster, before, "external_kv_transfer") == {}
    ((worker, tokens),) = gained(cluster, before, "local_compute").items()
    assert worker.startswith("decode") and tokens == 50


def test_a_long_prompt_goes_through_prefill_then_a_later_turn_stays_on_its_decode(cluster):
    turn1 = [1000 + i % 2000 for i in range(3 * 128 + 40)]
    before = snapshot(cluster)
    complete(cluster, turn1)
    ((decode, pulled),) = gained(cluster, before, "external_kv_transfer").items()
    assert pulled == len(turn1)
    assert gained(cluster, before, "local_compute") == {"prefill-0": len(turn1)}
    # The next turn: the whole first turn plus a short new message. Its uncached part on
    # the decode worker that holds the first turn is under the threshold.
    before = snapshot(cluster)
    complete(cluster, [*turn1, *range(500, 530)])
    assert gained(cluster, before, "external_kv_transfer") == {}
    assert gained(cluster, before, "local_cache_hit") == {decode: 3 * 128}
    assert set(gained(cluster, before, "local_compute")) == {decode}
