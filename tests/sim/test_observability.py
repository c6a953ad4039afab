"""The observability picture on a sim cluster of its own (1 prefill, 1 decode) with a
known workload, over real HTTP and the real OpenAI client:

- N requests count N, and the TTFT histogram counts N;
- the token counters equal the usage the clients received, streamed or not, and a
  stream whose client did not ask for usage gets none (the router asks for itself);
- the cost gauge equals a hand computation from the configured price;
- KV transfers and the decode pool's prefix hits (pulled KV is not a miss) are counted;
- every metric the Grafana dashboard names is one the cluster exports;
- request ids are answered, reach the engines, and mark the router's log lines (JSON);
- ``pdserve status --once`` draws the cluster with a viewer token.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster
from modelstore import tiny_llama
from tests.clusters import small_sim_cluster
from tests.conditions import wait_for
from tests.sim.faults import set_faults

MODEL = tiny_llama.SERVED_NAME
PRICE_USD_PER_HOUR = 1.8  # the sims' profile (tiny-cpu) reports kind "cpu"
VIEWER = "viewer-token-for-tests"
DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "pdserve-dashboard.json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    router_env = {
        "PDSERVE_WORKER_COST_USD_PER_HOUR": json.dumps(
            {"default": 99.0, "cpu": PRICE_USD_PER_HOUR}
        ),
        # Longer than the module runs: the windowed gauges then cover all of it.
        "PDSERVE_METRICS_WINDOW_S": "3600",
        "PDSERVE_ADMIN_TOKENS": f"grafana:viewer:{VIEWER}",
        "PDSERVE_LOG_FORMAT": "json",
    }
    with small_sim_cluster(
        tmp_path_factory.mktemp("observability"), max_model_len=4096, router_env=router_env
    ) as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="none", max_retries=0)


def metrics(cluster: LocalCluster):
    return scrape(cluster.router_url + "/metrics")


def prompt(i: int) -> str:
    return f"observability request {i}: " + " ".join(["tokens"] * (5 + 7 * i))


def test_requests_ttft_and_tokens_match_what_clients_received(cluster, client):
    before = metrics(cluster)
    prompt_tokens = completion_tokens = 0
    for i in range(6):  # whole answers
        answer = client.completions.create(model=MODEL, prompt=prompt(i), max_tokens=3 + i,
                                           temperature=0)  # fmt: skip
        prompt_tokens += answer.usage.prompt_tokens
        completion_tokens += answer.usage.completion_tokens
    for i in range(6, 10):  # streams that ask for usage
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt(i)}], max_tokens=4 + i,
            stream=True, stream_options={"include_usage": True}, temperature=0,
        )  # fmt: skip
        usage = [chunk.usage for chunk in stream if chunk.usage is not None]
        assert len(usage) == 1
        prompt_tokens += usage[0].prompt_tokens
        completion_tokens += usage[0].completion_tokens
    after = metrics(cluster)

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("pdserve_requests_total", model=MODEL, status="200") == 10
    assert grew("pdserve_time_to_first_token_seconds_count", model=MODEL) == 10
    assert grew("pdserve_e2e_request_latency_seconds_count", model=MODEL) == 10
    assert grew("pdserve_prompt_tokens_total", model=MODEL) == prompt_tokens
    assert grew("pdserve_generation_tokens_total", model=MODEL) == completion_tokens
    assert grew("pdserve_request_stage_seconds_count", model=MODEL, stage="prefill") == 10
    assert grew("pdserve_request_stage_seconds_count", model=MODEL, stage="decode") == 10
    # The handoff is timed apart only where the first byte is seen apart: streams.
    assert grew("pdserve_request_stage_seconds_count", model=MODEL, stage="kv_handoff") == 4
    assert grew("pdserve_time_per_output_token_seconds_count", model=MODEL) == 4


def test_a_stream_without_usage_asked_gets_none_yet_its_tokens_count(cluster, client):
    body = dict(model=MODEL, messages=[{"role": "user", "content": prompt(3)}], max_tokens=9,
                temperature=0, stream=True)  # fmt: skip
    with_usage = list(
        client.chat.completions.create(**body, stream_options={"include_usage": True})
    )
    expected = next(c.usage for c in with_usage if c.usage is not None)
    before = metrics(cluster)
    raw = httpx.post(cluster.router_url + "/v1/chat/completions", json=body, timeout=60)
    after = metrics(cluster)
    assert raw.status_code == 200
    assert '"usage"' not in raw.text, "the router's own usage request leaked to the client"
    assert raw.text.rstrip().endswith("data: [DONE]")
    text = "".join(c.choices[0].delta.content or "" for c in with_usage if c.choices)
    relayed = "".join(
        (json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
        for line in raw.text.splitlines() if line.startswith("data: {")
    )  # fmt: skip
    assert relayed == text
    grown = total(after, "pdserve_generation_tokens_total") - total(
        before, "pdserve_generation_tokens_total"
    )
    assert grown == expected.completion_tokens


def test_one_request_at_a_time_reuses_one_kept_connection_per_engine(cluster, client):
    """The engine client pools its connections: requests one after another, streamed or
    not, never open more than one connection to each engine, and all are idle after."""
    for i in range(8):
        body = dict(model=MODEL, prompt=prompt(i), max_tokens=4, temperature=0,
                    stream=i % 2 == 0)  # fmt: skip
        answer = httpx.post(cluster.router_url + "/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200
        # A stream's connection is pooled when the engine's last chunk, after [DONE], is in.
        wait_for(lambda: _connections(cluster)[1] == _connections(cluster)[0], 10,
                 "the request's connection back in the pool")  # fmt: skip
        open_now, idle_now = _connections(cluster)
        assert 1 <= idle_now <= open_now <= len(cluster.workers), (open_now, idle_now)


def _connections(cluster: LocalCluster) -> tuple[float, float]:
    families = metrics(cluster)
    return (total(families, "pdserve_engine_connections", state="open"),
            total(families, "pdserve_engine_connections", state="idle"))  # fmt: skip


def test_cost_gauge_equals_the_configured_price_over_tokens(cluster, client):
    client.completions.create(model=MODEL, prompt=prompt(1), max_tokens=5)
    # Worker-seconds accrue per heartbeat: wait for one after the request.
    seen = total(metrics(cluster), "pdserve_worker_seconds_total")
    wait_for(lambda: total(metrics(cluster), "pdserve_worker_seconds_total") > seen, 10,
             "a heartbeat to accrue worker-seconds")  # fmt: skip
    samples = metrics(cluster)
    seconds = total(samples, "pdserve_worker_seconds_total", model=MODEL, kind="cpu")
    assert total(samples, "pdserve_worker_seconds_total") == seconds  # every worker is "cpu"
    assert 0 < seconds <= 2 * (time.monotonic() - cluster_started_s(cluster)) + 1
    hand_usd = seconds * PRICE_USD_PER_HOUR / 3600
    assert total(samples, "pdserve_cost_usd_total", model=MODEL) == pytest.approx(hand_usd)
    for direction, counter in (("input", "pdserve_prompt_tokens_total"),
                               ("output", "pdserve_generation_tokens_total")):  # fmt: skip
        tokens = total(samples, counter, model=MODEL)
        gauge = total(samples, "pdserve_cost_usd_per_million_tokens", model=MODEL, pool="all",
                      direction=direction)  # fmt: skip
        assert gauge == pytest.approx(hand_usd / tokens * 1e6, rel=1e-6)
    prefill_usd = total(samples, "pdserve_cost_usd_total", model=MODEL, pool="prefill")
    output_tokens = total(samples, "pdserve_generation_tokens_total", model=MODEL)
    per_million = total(samples, "pdserve_cost_usd_per_million_tokens", model=MODEL,
                        pool="prefill", direction="output")  # fmt: skip
    assert per_million == pytest.approx(prefill_usd / output_tokens * 1e6)


def cluster_started_s(cluster: LocalCluster) -> float:
    """When the router process started, on this process's monotonic clock (upper bound)."""
    return time.monotonic() - (time.time() - Path(cluster.run_dir / "cluster.json").stat().st_mtime)


def test_kv_transfers_and_pool_prefix_hits_are_counted_per_pool(cluster, client):
    before = metrics(cluster)
    for i in range(3):
        client.completions.create(model=MODEL, prompt=prompt(20 + i), max_tokens=2)

    def transferred() -> float:
        return total(metrics(cluster), "pdserve_kv_transfers_total", pool="decode") - total(
            before, "pdserve_kv_transfers_total", pool="decode"
        )

    wait_for(lambda: transferred() >= 3, 10, "heartbeats carrying the decode's transfers")
    samples = metrics(cluster)
    assert total(samples, "pdserve_kv_transfer_bytes_total", pool="decode") > 0
    assert total(samples, "pdserve_kv_transfer_failures_total", pool="decode") == 0
    # The decode's prompt arrives over NIXL: a hit, never a miss.
    assert total(samples, "pdserve_pool_prefix_hit_ratio", pool="decode") == pytest.approx(1.0)
    prefill_ratio = total(samples, "pdserve_pool_prefix_hit_ratio", pool="prefill")
    assert 0 <= prefill_ratio < 1  # fresh prompts are computed there
    assert total(samples, "pdserve_worker_engine_memory_bytes") > 0


def test_a_conversations_next_turn_is_tokenized_only_past_the_turns_before(cluster, client):
    """The router's token prefix cache, as shipped: the second turn reuses the first's
    ids, counted in pdserve_prompt_chars_total. (That the ids are exactly the tokenizer's
    is test_token_prefix_cache's.)"""
    system = "You answer questions about serving systems in one short paragraph. " * 40
    turns = [{"role": "system", "content": system}, {"role": "user", "content": "What is P/D?"}]

    def chars(source: str) -> float:
        return total(metrics(cluster), "pdserve_prompt_chars_total", source=source)

    reused, tokenized = chars("reused"), chars("tokenized")
    first = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=4)
    turns += [{"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "And why split them?"}]  # fmt: skip
    second = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=4)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    gained_reused, gained_tokenized = chars("reused") - reused, chars("tokenized") - tokenized
    assert gained_reused >= len(system) - 1024  # the cache's stride: its last cut before
    assert gained_tokenized < 2 * 1024 + len(system)  # the first turn whole, then the tail


def exported_names(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in ("", "_total", "_bucket", "_count", "_sum")}
        names |= {sample.name for sample in family.samples}
    return names


def test_every_dashboard_metric_is_exported_by_the_cluster(cluster, client):
    client.completions.create(model=MODEL, prompt="warm the series", max_tokens=2, stream=False)
    exported = exported_names(httpx.get(cluster.router_url + "/metrics").text)
    for worker in cluster.workers:
        exported |= exported_names(httpx.get(worker.engine_url + "/metrics").text)
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert expressions
    named = {n for e in expressions for n in re.findall(r"\b(?:pdserve|vllm:)[a-z0-9_:]*", e)}
    missing = sorted(named - exported)
    assert not missing, f"the dashboard names metrics nothing exports: {missing}"


def test_request_ids_are_answered_reach_both_engines_and_mark_log_lines(cluster):
    body = {"model": MODEL, "prompt": prompt(2), "max_tokens": 3}
    answer = httpx.post(cluster.router_url + "/v1/completions", json=body,
                        headers={"X-Request-Id": "obs-trace-42"}, timeout=60)  # fmt: skip
    assert answer.status_code == 200
    assert answer.headers["x-request-id"] == "obs-trace-42"
    assert answer.json()["id"] == "cmpl-obs-trace-42"  # vLLM's naming: the decode got it
    generated = httpx.post(cluster.router_url + "/v1/completions", json=body, timeout=60)
    assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["x-request-id"])
    unsafe = httpx.post(cluster.router_url + "/v1/completions", json=body, timeout=60,
                        headers={"X-Request-Id": "two words"})  # fmt: skip
    assert unsafe.headers["x-request-id"] != "two words"
    # A failing decode (the prefill worker then answers whole): the router's log lines
    # about it carry the request id, as JSON.
    set_faults(cluster, "decode-0", transfer_failure_probability=1.0)
    try:
        rescued = httpx.post(cluster.router_url + "/v1/completions", json=body, timeout=60,
                             headers={"X-Request-Id": "obs-failing-7"})  # fmt: skip
    finally:
        set_faults(cluster, "decode-0", transfer_failure_probability=0.0)
    assert rescued.status_code == 200 and rescued.headers["x-request-id"] == "obs-failing-7"
    lines = [json.loads(line) for line in (cluster.run_dir / "router.log").read_text().splitlines()
             if line.startswith("{")]  # fmt: skip
    about = [line for line in lines if line.get("request_id") == "obs-failing-7"]
    assert about and all(line["process"] == "router" for line in about)
    assert any("decode-0" in line["message"] for line in about)
    assert not any("observability request" in line["message"] for line in lines)  # no prompts


def test_status_cli_draws_the_cluster_with_a_viewer_token(cluster):
    assert httpx.get(cluster.router_url + "/admin/v1/status").status_code == 401
    snapshot = httpx.get(cluster.router_url + "/admin/v1/status",
                         headers={"Authorization": f"Bearer {VIEWER}"}).json()  # fmt: skip
    (model,) = snapshot["models"]
    assert model["model"] == MODEL and model["workers_by_role"] == {"prefill": 1, "decode": 1}
    drawn = subprocess.run(
        [sys.executable, "-m", "cli.main", "status", "--once", "--router-url",
         cluster.router_url, "--token", VIEWER],
        capture_output=True, text=True, timeout=60, env={"COLUMNS": "140", "PATH": ""},
    )  # fmt: skip
    assert drawn.returncode == 0, drawn.stderr
    for expected in (MODEL, "prefill-0", "decode-0", "1P 1D", "TTFT p99"):
        assert expected in drawn.stdout
    targets = httpx.get(cluster.router_url + "/admin/v1/scrape_targets",
                        headers={"Authorization": f"Bearer {VIEWER}"}).json()  # fmt: skip
    assert sorted(t["labels"]["worker"] for t in targets) == ["decode-0", "prefill-0"]
