"""A decode worker stopped with SIGTERM under load. Its agent drains for
``drain_timeout_s``, then stops the engine, which (as vLLM 0.32's engine core) aborts
what is still running: ``finish_reason: "abort"`` and then ``[DONE]``. The router must not
relay that as a whole answer; a stream it can continue moves to another decode worker
instead of being truncated, a whole answer is retried there. A sim cluster of its own
(1 prefill, 4 decode: each test stops one, and a stopped worker does not come back),
with inexact migration on."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster
from modelstore import tiny_llama
from tests.clusters import small_sim_cluster
from tests.conditions import wait_for
from tests.generation import Generation, generate
from tests.sim.faults import serving_decode

MODEL = tiny_llama.SERVED_NAME
# ~7 ms a token on tiny-cpu: 600 tokens outlast the 2 s drain.
LONG = {"model": MODEL, "prompt": "a long story", "max_tokens": 600, "temperature": 0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    env = {"PDSERVE_STREAM_MIGRATION_INEXACT": "true"}
    run_dir = tmp_path_factory.mktemp("sigterm")
    with small_sim_cluster(run_dir, decode=4, router_env=env) as local:
        yield local


@pytest.fixture(scope="module")
def uninterrupted(cluster: LocalCluster) -> Generation:
    """The answer with nothing stopped (greedy: the same streamed or whole)."""
    answer = generate(cluster.router_url, "/v1/completions", LONG)
    assert answer.status == 200 and answer.usage["completion_tokens"] == LONG["max_tokens"]
    return answer


def stop_decode(cluster: LocalCluster, name: str) -> None:
    cluster.agents[name].send_signal(signal.SIGTERM)


def stream_and_stop_its_decode_at_chunk_50(cluster: LocalCluster, body: dict) -> Generation:
    """Stream ``body``; SIGTERM the decode serving it at the 50th chunk; what the client
    got, once that agent has stopped."""
    stopped: list[str] = []

    def stop_the_decode_at_chunk_50(so_far: Generation) -> None:
        if so_far.chunks == 50:
            stopped.append(serving_decode(cluster))
            stop_decode(cluster, stopped[0])

    moved = generate(cluster.router_url, "/v1/completions", body,
                     on_chunk=stop_the_decode_at_chunk_50)  # fmt: skip
    assert stopped and cluster.agents[stopped[0]].wait(timeout=30) == 0
    assert moved.done and not moved.error_events, moved.error_events
    return moved


def test_a_stream_longer_than_the_drain_moves_to_another_decode_unchanged(cluster, uninterrupted):
    body = {**LONG, "stream": True, "stream_options": {"include_usage": True}}
    moved = stream_and_stop_its_decode_at_chunk_50(cluster, body)
    assert moved.text == uninterrupted.text and moved.usage == uninterrupted.usage
    migrated = total(scrape(cluster.router_url + "/metrics"), "pdserve_stream_migrations_total",
                     outcome="migrated")  # fmt: skip
    assert migrated == 1  # the first test on this cluster


def test_with_inexact_migration_on_an_unseeded_stream_moves_and_says_so(cluster, uninterrupted):
    body = {**LONG, "temperature": 0.9, "stream": True, "stream_options": {"include_usage": True}}
    moved = stream_and_stop_its_decode_at_chunk_50(cluster, body)
    assert moved.usage == uninterrupted.usage and len(moved.response_ids) == 1
    assert moved.migrations == [{"exact": False, "tokens_before": moved.chunks_before_migration}]
    # The sim's sampling is a function of its context, so even a sampled continuation is
    # the uninterrupted text there: what shows that no text was lost or repeated.
    assert moved.text == uninterrupted.text


@pytest.mark.slow  # the fast tier's 2 minutes: the stream case above is the common one
def test_a_whole_answer_cut_by_a_stopping_decode_is_answered_by_another(cluster, uninterrupted):
    answer: list[Generation] = []
    asking = threading.Thread(
        target=lambda: answer.append(generate(cluster.router_url, "/v1/completions", LONG))
    )
    asking.start()
    wait_for(lambda: _running_on(cluster) is not None, 10, "the request to reach a decode")
    stop_decode(cluster, _running_on(cluster))
    asking.join(timeout=60)
    assert answer[0].status == 200 and answer[0].text == uninterrupted.text
    assert answer[0].body["choices"][0]["finish_reason"] == "length"


def _running_on(cluster: LocalCluster) -> str | None:
    try:
        return serving_decode(cluster)
    except AssertionError:
        return None
