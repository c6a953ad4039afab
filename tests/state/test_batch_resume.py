"""A batch outlives its router: the router running it is SIGKILLed mid-batch, another
router on the same redis-server (and files directory) takes it over once the lease
lapses, and the batch completes with every ``custom_id`` exactly once, the finished
lines not sent again. Then a decode worker is SIGKILLed mid-batch: no line is lost."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator

import openai
import pytest

from agent import process_group
from loadgen.prometheus_text import scrape, total
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from localrun.redis_server import RedisServer
from modelstore import tiny_llama
from tests.clusters import MODEL
from tests.conditions import wait_for

# Slow tier: a 1P+2D sim cluster, Redis and two routers, one killed.
pytestmark = pytest.mark.slow

LEASE_S = 3
IN_FLIGHT = 4
ENDED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def cluster(tmp_path) -> Iterator[tuple[LocalCluster, str]]:
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        port_a, port_b = free_ports(2)
        url_b = f"http://127.0.0.1:{port_b}"
        env = {"PDSERVE_STATE_URL": redis.url, "PDSERVE_BATCH_LEASE_S": str(LEASE_S),
               "PDSERVE_BATCH_POLL_S": "0.2", "PDSERVE_BATCH_MAX_IN_FLIGHT": str(IN_FLIGHT),
               "PDSERVE_HEARTBEAT_TIMEOUT_S": "3"}  # fmt: skip
        plan = ClusterPlan(
            model_path=tiny_llama.ensure(), served_name=MODEL, prefill=1, decode=2,
            port=port_a, run_dir=tmp_path, ready_timeout_s=60, heartbeat_interval_s=0.5,
            drain_timeout_s=5, engine="sim", router_env=env, extra_router_urls=(url_b,),
        )  # fmt: skip
        local = LocalCluster(plan, say=lambda _: None)
        try:
            local.start()
            yield local, url_b
        finally:
            local.stop()
    finally:
        redis.stop()


def lines(count: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
        "body": {"model": MODEL, "prompt": f"resume line {i}", "max_tokens": 32,
                 "temperature": 0},
    }).encode() + b"\n" for i in range(count))  # fmt: skip


def start(api: openai.OpenAI, count: int) -> str:
    uploaded = api.files.create(file=("in.jsonl", lines(count)), purpose="batch")
    return api.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                              completion_window="24h").id  # fmt: skip


def every_line_once(api: openai.OpenAI, batch_id: str, count: int):
    wait_for(lambda: api.batches.retrieve(batch_id).status in ENDED, 120, "batch ended")
    done = api.batches.retrieve(batch_id)
    assert done.status == "completed", done
    out = [json.loads(x) for x in api.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(f"req-{i}" for i in range(count))
    assert done.error_file_id is None and done.request_counts.completed == count
    return done


def engine_requests(cluster: LocalCluster) -> float:
    return sum(total(scrape(w.engine_url + "/metrics"), "vllm:request_success_total")
               for w in cluster.workers if w.role == "decode")  # fmt: skip


def test_a_batch_survives_its_router_and_a_decode_worker(cluster):
    local, url_b = cluster
    api_a = openai.OpenAI(base_url=local.router_url + "/v1", api_key="x", max_retries=0)
    count = 60
    decode_engine = local.worker_status()["decode-0"]["engine_pid"]  # while A answers
    batch_id = start(api_a, count)
    wait_for(lambda: api_a.batches.retrieve(batch_id).request_counts.completed >= 10, 60,
             "some lines done")  # fmt: skip
    local.router.send_signal(signal.SIGKILL)  # mid-batch: its lease is left to lapse
    local.router.wait(timeout=10)
    router_b = local.start_replica(url_b)
    try:
        api_b = openai.OpenAI(base_url=url_b + "/v1", api_key="x", max_retries=0)
        every_line_once(api_b, batch_id, count)
        # Lines kept before the kill were not sent again: only those in flight then were.
        assert engine_requests(local) <= count + IN_FLIGHT

        second = start(api_b, count)
        wait_for(lambda: api_b.batches.retrieve(second).request_counts.completed >= 10, 60,
                 "some lines of the second batch done")  # fmt: skip
        os.kill(decode_engine, signal.SIGKILL)  # its agent starts another
        every_line_once(api_b, second, count)
    finally:
        process_group.stop([router_b], grace_s=10)


def test_two_live_routers_run_a_batch_once(cluster):
    """Both routers scan the same state: one takes the lease and keeps it, the other
    never sends a line, and no line is sent twice."""
    local, url_b = cluster
    router_b = local.start_replica(url_b)
    try:
        api_a = openai.OpenAI(base_url=local.router_url + "/v1", api_key="x", max_retries=0)
        count, before = 40, engine_requests(local)
        batch_id = start(api_a, count)
        runners: set[str] = set()

        def ended() -> bool:
            listed = local.admin("GET", "/admin/v1/batches")["data"]
            batch = next(b for b in listed if b["id"] == batch_id)
            runners.update([batch["runner"]] if batch["runner"] else [])
            return batch["status"] in ENDED

        wait_for(ended, 120, "batch ended")
        every_line_once(api_a, batch_id, count)
        assert len(runners) == 1
        assert engine_requests(local) - before == count  # none sent twice
        kept = [total(scrape(url + "/metrics"), "pdserve_batch_lines_total")
                for url in (local.router_url, url_b)]  # fmt: skip
        assert sorted(kept) == [0, count]
    finally:
        process_group.stop([router_b], grace_s=10)
