"""One router as two processes on one port (``router_processes=2``), sharing a real
redis-server, in front of a sim cluster: requests spread over both processes, and the
metrics any process answers with count every request once (prometheus-client's
multiprocess mode), as the tokens and the derived gauges do."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadgen.prometheus_text import scrape, total
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from localrun.redis_server import RedisServer
from modelstore import tiny_llama
from tests.clusters import MODEL
from tests.conditions import wait_for

# Slow tier: a router of two processes beside a cluster of its own (about 12 CPU-seconds).
pytestmark = pytest.mark.slow

VIEWER = "processes-viewer"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    run_dir = tmp_path_factory.mktemp("router-processes")
    metrics_dir = run_dir / "metrics"
    redis = RedisServer(run_dir)
    redis.start()
    try:
        (port,) = free_ports(1)
        plan = ClusterPlan(
            model_path=tiny_llama.ensure(), served_name=MODEL, prefill=1, decode=1, port=port,
            run_dir=run_dir, ready_timeout_s=60, heartbeat_interval_s=0.5, drain_timeout_s=2,
            engine="sim",
            router_env={"PDSERVE_STATE_URL": redis.url, "PDSERVE_ROUTER_PROCESSES": "2",
                        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                        "PDSERVE_ADMIN_TOKENS": f"viewer:viewer:{VIEWER}"},
        )  # fmt: skip
        local = LocalCluster(plan, say=lambda _: None)
        try:
            local.start()
            yield local, metrics_dir
        finally:
            local.stop()
    finally:
        redis.stop()


def router_pids(metrics_dir: Path) -> set[int]:
    return {int(m.group(1)) for p in metrics_dir.glob("counter_*.db")
            if (m := re.fullmatch(r"counter_(\d+)\.db", p.name))}  # fmt: skip


def test_two_processes_serve_and_every_scrape_counts_each_request_once(cluster):
    local, metrics_dir = cluster
    url = local.router_url

    def both_processes_see_the_pools() -> bool:
        # A fresh connection each time: the kernel spreads them over the processes.
        return all(
            httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "ping",
                                                      "max_tokens": 1}).status_code == 200
            for _ in range(8)
        )  # fmt: skip

    wait_for(both_processes_see_the_pools, 30, "both router processes to know the workers")
    before = scrape(url + "/metrics")
    prompt_tokens = completion_tokens = 0
    for i in range(30):
        answer = httpx.post(
            url + "/v1/completions",
            timeout=30,
            json={"model": MODEL, "prompt": f"process spread {i} " + "word " * i, "max_tokens": 3},
        )
        assert answer.status_code == 200, answer.text
        prompt_tokens += answer.json()["usage"]["prompt_tokens"]
        completion_tokens += answer.json()["usage"]["completion_tokens"]
    assert len(router_pids(metrics_dir)) == 2, "the requests did not reach both processes"
    for _ in range(6):  # each scrape may be answered by either process: all agree
        after = scrape(url + "/metrics")

        def grew(name: str, after=after, **labels: str) -> float:
            return total(after, name, **labels) - total(before, name, **labels)

        assert grew("pdserve_requests_total", status="200") == 30
        assert grew("pdserve_time_to_first_token_seconds_count") == 30
        assert grew("pdserve_prompt_tokens_total") == prompt_tokens
        assert grew("pdserve_generation_tokens_total") == completion_tokens
        assert grew("pdserve_routed_requests_total", role="decode") == 30
    rates = [total(scrape(url + "/metrics"), "pdserve_tokens_per_second", direction="output")
             for _ in range(4)]  # fmt: skip
    assert min(rates) > 0 and max(rates) == pytest.approx(min(rates), rel=0.5)


def test_status_adds_up_the_processes(cluster):
    local, _ = cluster
    headers = {"Authorization": f"Bearer {VIEWER}"}
    for _ in range(4):
        status = httpx.get(local.router_url + "/admin/v1/status", headers=headers).json()
        (model,) = status["models"]
        assert model["workers_by_role"] == {"prefill": 1, "decode": 1}
        assert model["output_tokens_per_s"] > 0
