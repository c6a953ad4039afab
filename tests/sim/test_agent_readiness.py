"""The agent's ready file, which a Kubernetes readiness probe reads (deploy/k8s): present
exactly while the router takes the worker as ready, gone as soon as SIGTERM starts a
drain (a preStop hook sends it), while the agent still finishes what it serves. A sim
cluster of its own (1 prefill, 1 decode), its agents holding their tokens in files as the
pods' init containers leave them.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
from collections.abc import Iterator

import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster
from tests.clusters import MODEL, small_sim_cluster
from tests.conditions import wait_for
from tests.generation import Generation, generate

# ~7 ms a token on tiny-cpu: 800 tokens outlast the moment the drain starts by seconds.
LONG = {"model": MODEL, "prompt": "a long story", "max_tokens": 800, "temperature": 0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    run_dir = tmp_path_factory.mktemp("readiness")
    with small_sim_cluster(run_dir, drain_timeout_s=60) as local:
        yield local


def test_a_ready_worker_has_its_ready_file_and_a_private_token_file(cluster: LocalCluster):
    for name in ("prefill-0", "decode-0"):
        assert name in cluster.ready_workers()
        wait_for(cluster.ready_file(name).exists, 10, f"{name}'s ready file")
        token_file = cluster.run_dir / f"{name}.agent-token"
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        agent_env = (f"/proc/{cluster.agents[name].pid}/environ",)
        with open(*agent_env, "rb") as environ:
            assert b"PDSERVE_AGENT_TOKEN=" not in environ.read()


def test_each_workers_start_is_reported_whole_for_a_sim(cluster: LocalCluster):
    """A simulator writes none of vLLM's log lines: its start is reported whole."""
    samples = scrape(cluster.router_url + "/metrics")
    for name in ("prefill-0", "decode-0"):
        assert total(samples, "pdserve_worker_start_seconds", worker=name,
                     phase="engine_start") > 0  # fmt: skip
        assert total(samples, "pdserve_worker_start_seconds", worker=name,
                     phase="weights_load") == 0  # fmt: skip


def test_sigterm_removes_the_ready_file_at_once_and_the_stream_still_finishes(
    cluster: LocalCluster,
):
    decode = cluster.agents["decode-0"]
    ready_file = cluster.ready_file("decode-0")
    answers: list[Generation] = []
    streaming = threading.Thread(
        target=lambda: answers.append(
            generate(
                cluster.router_url,
                "/v1/completions",
                {**LONG, "stream": True, "stream_options": {"include_usage": True}},
            )
        )
    )
    streaming.start()
    wait_for(lambda: cluster.worker_status()["decode-0"]["load"]["num_requests_running"] > 0,
             10, "the stream to reach decode-0")  # fmt: skip
    decode.send_signal(signal.SIGTERM)

    wait_for(lambda: not ready_file.exists(), 10, "the ready file to go")
    assert decode.poll() is None, "the agent still drains while it is not ready"
    streaming.join(timeout=60)
    (answer,) = answers
    assert answer.status == 200, answer.body
    assert answer.usage["completion_tokens"] == LONG["max_tokens"]
    assert decode.wait(timeout=60) == 0
    assert not ready_file.exists()
