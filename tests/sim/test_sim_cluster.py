"""The router and agents run unchanged on sims: P/D equals colocated, KV moves, failures heal."""

from __future__ import annotations

import json
import os
import signal
import socket
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from kvtransfer.handoff import PREFILL_REQUEST_PARAMS
from loadgen.prometheus_text import scrape, total
from tests.clusters import COLOCATED_MODEL, MODEL
from tests.conditions import wait_for
from tests.generation import generate
from tests.kv_held import a_refused_handoff_frees_its_blocks
from tests.listeners import beyond_loopback, listeners
from tests.sim.faults import serving_decode, serving_decodes, set_faults

CASES = [
    ("/v1/completions", {"prompt": "def fibonacci(n):"}),
    ("/v1/completions", {"prompt": "import os\n" * 200}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 2+2?"}]}),
]


@pytest.mark.parametrize(
    "delivery",
    [{"stream": False}, {"stream": True}, {"stream": True, "stream_interval": 5}],
    ids=["whole", "stream", "stream 5 tokens a chunk"],
)
@pytest.mark.parametrize(("path", "payload"), CASES)
def test_disaggregated_output_equals_colocated(sim_cluster, path, payload, delivery):
    body = {**payload, "max_tokens": 12, "return_token_ids": True, **delivery}
    url = sim_cluster.router_url
    reference = generate(url, path, {**body, "model": COLOCATED_MODEL})
    routed = generate(url, path, {**body, "model": MODEL})
    assert reference.status == routed.status == 200, routed.body
    assert len(routed.token_ids) == 12
    assert routed.token_ids == reference.token_ids and routed.text == reference.text


def test_decode_takes_the_prompt_from_the_transfer(sim_cluster):
    decodes = [w.engine_url for w in sim_cluster.workers if w.role == "decode"]

    def by_source(source: str) -> float:
        return sum(
            total(scrape(u + "/metrics"), "vllm:prompt_tokens_by_source_total", source=source)
            for u in decodes
        )

    before = {s: by_source(s) for s in ("external_kv_transfer", "local_compute")}
    result = generate(sim_cluster.router_url, "/v1/completions",
                      {"model": MODEL, "prompt": "transfer me " * 30, "max_tokens": 3})  # fmt: skip
    assert result.status == 200
    assert by_source("local_compute") == before["local_compute"]
    gained = by_source("external_kv_transfer") - before["external_kv_transfer"]
    assert gained == result.usage["prompt_tokens"]


def test_a_decode_pulls_only_the_kv_it_lacks(sim_cluster):
    """As vLLM's NIXL pull: the prompt less what the decode engine holds crosses the link,
    so a repeated prompt moves one block's worth at most, not the whole prompt again."""
    prefill = sim_cluster.worker("prefill-0").engine_url
    decode = sim_cluster.worker("decode-0").engine_url
    body = {"model": MODEL, "prompt": "pulled once " * 64, "max_tokens": 1}

    def pulled_bytes() -> float:
        return total(scrape(decode + "/metrics"), "vllm:nixl_bytes_transferred_sum")

    gained = []
    for _ in range(2):
        handoff = httpx.post(
            prefill + "/v1/completions",
            json={**body, "kv_transfer_params": {"do_remote_decode": True}},
        )
        before = pulled_bytes()
        answer = httpx.post(
            decode + "/v1/completions",
            json={
                **body,
                "max_tokens": 3,
                "kv_transfer_params": handoff.json()["kv_transfer_params"],
            },
        )
        assert answer.status_code == 200, answer.text
        gained.append(pulled_bytes() - before)
    prompt_tokens = answer.json()["usage"]["prompt_tokens"]
    bytes_per_token = gained[0] / prompt_tokens
    assert bytes_per_token > 0
    assert 1 <= gained[1] / bytes_per_token <= 16  # the tail past the last full block


def test_openai_client_streams_concurrently(sim_cluster):
    client = openai.OpenAI(base_url=sim_cluster.router_url + "/v1", api_key="x", max_retries=0)
    streams = [
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"question {i}"}],
            max_tokens=20, stream=True,
        )
        for i in range(8)
    ]  # fmt: skip
    texts = ["".join(c.choices[0].delta.content or "" for c in s if c.choices) for s in streams]
    assert all(texts) and len(set(texts)) == 8


def test_a_handoff_past_its_lease_fails_like_vllm(sim_cluster):
    """The producer frees unpulled blocks when the lease ends; a late decode then fails."""
    prefill = sim_cluster.worker("prefill-0").engine_url
    decode = sim_cluster.worker("decode-0").engine_url
    body = {"model": MODEL, "prompt": "held " * 300, "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    handoff = httpx.post(prefill + "/v1/completions", json=body).json()["kv_transfer_params"]
    usage = lambda: total(scrape(prefill + "/metrics"), "vllm:kv_cache_usage_perc")  # noqa: E731
    assert usage() > 0, "the producer holds the blocks for the decode"
    wait_for(lambda: usage() == 0, 60, "the producer's lease to expire")
    late = httpx.post(decode + "/v1/completions",
                      json={**body, "max_tokens": 4, "kv_transfer_params": handoff})  # fmt: skip
    assert late.status_code == 500
    assert "KV transfer failed" in late.json()["error"]["message"]


def test_a_crashed_decode_ends_the_stream_with_an_error_then_the_cluster_heals(sim_cluster):
    client = openai.OpenAI(base_url=sim_cluster.router_url + "/v1", api_key="x", max_retries=0)
    before = sim_cluster.worker_status()
    stream = client.completions.create(model=MODEL, prompt="long", max_tokens=2000, stream=True)
    chunks = 0
    with pytest.raises(openai.APIError):
        for _ in stream:
            chunks += 1
            if chunks == 3:
                killed = serving_decode(sim_cluster)
                os.kill(before[killed]["engine_pid"], signal.SIGKILL)
    assert chunks >= 3
    wait_for(
        lambda: (w := sim_cluster.worker_status().get(killed)) is not None
        and w["eligible"] and w["incarnation"] > before[killed]["incarnation"],
        60, "the agent to restart its sim",
    )  # fmt: skip
    again = generate(sim_cluster.router_url, "/v1/completions",
                     {"model": MODEL, "prompt": "after", "max_tokens": 4})  # fmt: skip
    assert again.status == 200


def test_a_client_that_leaves_before_a_whole_answer_has_it_aborted_on_the_engine(sim_cluster):
    """vLLM aborts a request whose client left. Before the first answer byte, the router
    learns of it only by watching the connection; it must then close its own call, so the
    decode frees the slot and KV instead of writing 2,000 tokens for nobody."""
    decodes = [w.engine_url for w in sim_cluster.workers if w.role == "decode"]

    def engines(name: str, **labels: str) -> float:
        return sum(total(scrape(url + "/metrics"), name, **labels) for url in decodes)

    def gone_499() -> float:
        families = scrape(sim_cluster.router_url + "/metrics")
        return total(families, "pdserve_requests_total", status="499")

    aborted_before, gone_before = (
        engines("vllm:request_success_total", finished_reason="abort"),
        gone_499(),
    )
    body = json.dumps({"model": MODEL, "prompt": "leave early", "max_tokens": 2000,
                       "ignore_eos": True}).encode()  # fmt: skip
    router = urlsplit(sim_cluster.router_url)
    with socket.create_connection((router.hostname, router.port), timeout=10) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: router\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                    % (len(body), body))  # fmt: skip
        wait_for(lambda: engines("vllm:num_requests_running") >= 1, 30, "the decode to start")
    wait_for(lambda: engines("vllm:num_requests_running") == 0, 15, "the decode to be aborted")
    assert engines("vllm:request_success_total", finished_reason="abort") > aborted_before
    wait_for(lambda: gone_499() > gone_before, 10, "the router to count the client gone")


def test_fault_endpoint_needs_the_token_and_refuses_bad_values_whole(sim_cluster):
    url = sim_cluster.worker("decode-1").engine_url + "/sim/faults"
    assert httpx.post(url, json={"slowdown": 2}).status_code == 401
    refused = set_faults(sim_cluster, "decode-1", slowdown=2, transfer_failure_probability=3)
    assert refused.status_code == 400
    current = httpx.get(url, headers={"Authorization": f"Bearer {sim_cluster.engine_token}"})
    assert current.json()["slowdown"] == 1.0, "a refused update changes nothing"


def test_a_failing_transfer_on_one_decode_is_retried_on_the_other(sim_cluster):
    """And the handoff the failed decode never pulled is freed on its producer now (through
    another decode, ``kv_release.py``), not when its lease runs out."""

    def released() -> float:
        samples = scrape(sim_cluster.router_url + "/metrics")
        return total(samples, "pdserve_kv_releases_total", outcome="released")

    released_before = released()
    assert set_faults(sim_cluster, "decode-0", transfer_failure_probability=1).status_code == 200
    try:
        # The round_robin alias: four requests in a row visit each of the four decodes,
        # so one of them is sent to decode-0 first (prefix_affinity might never pick it).
        statuses = {
            generate(sim_cluster.router_url, "/v1/completions",
                     {"model": f"{MODEL}-rr", "prompt": f"p{i}", "max_tokens": 2}).status
            for i in range(4)
        }  # fmt: skip
        assert statuses == {200}
        samples = scrape(sim_cluster.router_url + "/metrics")
        failures = total(samples, "pdserve_upstream_failures_total", role="decode", kind="http_500")
        assert failures >= 1, "round-robin sent a request to the failing decode first"
    finally:
        set_faults(sim_cluster, "decode-0", transfer_failure_probability=0)
    wait_for(lambda: released() > released_before, 10, "the orphaned handoff's release")
    prefills = [w.engine_url for w in sim_cluster.workers if w.role == "prefill"]

    def held() -> float:
        return sum(total(scrape(url + "/metrics"), "vllm:kv_cache_usage_perc") for url in prefills)

    # Before the sim cluster's 6 s lease would have freed it.
    wait_for(lambda: held() == 0, 3, "the producers to hold no KV")


def test_a_handoff_a_decode_refuses_is_freed_on_its_producer_at_once(sim_cluster):
    """The sim's consumer, like vLLM's, tells the producer to free a refused request's
    handoff (the sim cluster's lease: 6 s)."""
    prefill, decode = (sim_cluster.worker(n).engine_url for n in ("prefill-0", "decode-0"))
    a_refused_handoff_frees_its_blocks(prefill, decode, MODEL, freed_within_s=3)


def stall_checks(cluster, outcome: str) -> float:
    return total(scrape(cluster.router_url + "/metrics"), "pdserve_stall_checks_total",
                 outcome=outcome)  # fmt: skip


def test_a_hung_decode_leaves_rotation_its_stream_moves_and_it_returns_when_it_recovers(
    sim_cluster,
):
    """Its stream goes silent, the router probes it at once, finds it hung, ejects it and
    fails the calls in flight on it: the stream migrates within seconds. The client's
    10 s read timeout is under what the periodic probes alone take with the shipped
    settings (3 failures x (5 s timeout + interval)): this passes by the stall check."""
    body = {"model": MODEL, "prompt": "a stream on a decode that hangs", "max_tokens": 400,
            "temperature": 0, "stream": True}  # fmt: skip
    reference = generate(sim_cluster.router_url, "/v1/completions", body)
    hung: list[str] = []
    found_hung = stall_checks(sim_cluster, "hung")

    def hang_the_decode_at_chunk_20(so_far) -> None:
        if so_far.chunks == 20:
            hung.append(serving_decode(sim_cluster))
            assert set_faults(sim_cluster, hung[0], hang=True).status_code == 200

    try:
        moved = generate(sim_cluster.router_url, "/v1/completions", body, timeout_s=10,
                         on_chunk=hang_the_decode_at_chunk_20)  # fmt: skip
        assert hung and not sim_cluster.worker_status()[hung[0]]["eligible"]
        assert stall_checks(sim_cluster, "hung") == found_hung + 1
        statuses = {
            generate(sim_cluster.router_url, "/v1/completions",
                     {"model": MODEL, "prompt": f"h{i}", "max_tokens": 2}).status
            for i in range(4)
        }  # fmt: skip
        assert statuses == {200}, "traffic avoids the hung decode"
    finally:
        for name in hung:
            set_faults(sim_cluster, name, hang=False)
    assert moved.done and moved.text == reference.text and len(moved.migrations) == 1
    for name in hung:
        wait_for(lambda n=name: sim_cluster.worker_status()[n]["eligible"], 30,
                 "the recovered decode to return")  # fmt: skip


@pytest.mark.slow  # ~10 s; the stream hang test above is the fast tier's hang case
def test_a_request_a_hung_decode_took_moves_on_without_the_kv_it_may_have_pulled(sim_cluster):
    """The hung decode got the request (and pulled its KV: the sim pulls before it steps)
    but never sent a first byte. The stall check ejects it; the next decode computes the
    prompt itself. Sending it the same handoff would read blocks the producer freed after
    the first pull (the sim's producer refuses it: a decode 500; vLLM would read them)."""
    bodies = [{"model": f"{MODEL}-rr", "prompt": f"a first token never sent {i}",
               "max_tokens": 4, "temperature": 0} for i in range(4)]  # fmt: skip
    references = [generate(sim_cluster.router_url, COMPLETIONS, b).text for b in bodies]

    def decode_500s() -> float:
        samples = scrape(sim_cluster.router_url + "/metrics")
        return total(samples, "pdserve_upstream_failures_total", role="decode", kind="http_500")

    failed_before, found_hung = decode_500s(), stall_checks(sim_cluster, "hung")
    assert set_faults(sim_cluster, "decode-0", hang=True).status_code == 200
    try:
        # Round robin: one of four requests in a row goes to decode-0 first.
        results = [generate(sim_cluster.router_url, COMPLETIONS, b, timeout_s=10)
                   for b in bodies]  # fmt: skip
    finally:
        set_faults(sim_cluster, "decode-0", hang=False)
    assert [r.status for r in results] == [200] * 4
    assert [r.text for r in results] == references
    assert stall_checks(sim_cluster, "hung") == found_hung + 1
    assert decode_500s() == failed_before, "the pulled handoff was sent to another decode"
    wait_for(lambda: sim_cluster.worker_status()["decode-0"]["eligible"], 30,
             "the recovered decode to return")  # fmt: skip


@pytest.mark.slow  # 6 s of waiting on slowed steps; the unit test covers the same rule
def test_a_slow_decode_is_probed_found_alive_and_keeps_its_stream(sim_cluster):
    """Silence alone is not a hang: an engine whose steps take over a second still answers
    its /health, so its stream stays where it is, whole and unmigrated."""
    body = {"model": MODEL, "prompt": "a stream on a slow decode", "max_tokens": 3,
            "temperature": 0, "stream": True}  # fmt: skip
    reference = generate(sim_cluster.router_url, "/v1/completions", body)
    decodes = [w.name for w in sim_cluster.workers if w.role == "decode"]
    found_alive, found_hung = stall_checks(sim_cluster, "alive"), stall_checks(sim_cluster, "hung")
    try:
        for name in decodes:
            # A tiny-cpu decode step takes ~7 ms; x250 makes it ~1.7 s, past the 1 s stall time.
            assert set_faults(sim_cluster, name, slowdown=250).status_code == 200
        slow = generate(sim_cluster.router_url, "/v1/completions", body)
    finally:
        for name in decodes:
            set_faults(sim_cluster, name, slowdown=1.0)
    assert slow.done and slow.text == reference.text and slow.migrations == []
    assert stall_checks(sim_cluster, "alive") > found_alive
    assert stall_checks(sim_cluster, "hung") == found_hung
    assert all(sim_cluster.worker_status()[name]["eligible"] for name in decodes)


@pytest.mark.slow  # 15 s of the fast tier; the engine-level lease test above stays fast
def test_a_decode_that_cannot_start_within_the_kv_lease_is_failed_not_relayed(sim_cluster):
    """Past the producer's lease the blocks may be reused: the router must not relay output.

    It prefills again once (``kv_lease_reprefills``) for the next decode; when that one
    misses the lease too, a prefill worker answers it whole (``serve_degraded``)."""
    decodes = [w.name for w in sim_cluster.workers if w.role == "decode"]
    for name in decodes:
        # A tiny-cpu decode step takes ~7 ms; x2000 puts the first token past the 6 s lease.
        assert set_faults(sim_cluster, name, slowdown=2000).status_code == 200

    def counters() -> tuple[float, float]:
        samples = scrape(sim_cluster.router_url + "/metrics")
        return (total(samples, "pdserve_kv_lease_reprefills_total"),
                total(samples, "pdserve_routed_requests_total", worker="prefill-0")
                + total(samples, "pdserve_routed_requests_total", worker="prefill-1"))  # fmt: skip

    try:
        reprefills_before, prefills_before = counters()
        body = {"model": MODEL, "prompt": "slow", "max_tokens": 2, "stream": True}
        result = generate(sim_cluster.router_url, "/v1/completions", body)
        assert result.status == 200 and result.done and result.text
        reprefills, prefills = counters()
        assert reprefills - reprefills_before == 1, "one fresh prefill for the second decode"
        assert prefills - prefills_before == 3, "two prefills, then one answering whole"
    finally:
        for name in decodes:
            set_faults(sim_cluster, name, slowdown=1)
    for name in decodes:
        wait_for(lambda n=name: sim_cluster.worker_status()[n]["eligible"], 30, f"{name} back")
    # A step begun while slowed sleeps its 2000x out (seconds on a busy box): the tests
    # after this one, on the same cluster, count running requests, so wait it out here.
    wait_for(lambda: not serving_decodes(sim_cluster), 60, "the slowed decodes' steps ended")


def test_a_prompt_beyond_the_context_window_is_refused_before_any_worker_sees_it(sim_cluster):
    def routed() -> float:
        return total(scrape(sim_cluster.router_url + "/metrics"), "pdserve_routed_requests_total")

    before = routed()
    window = 4096  # the cluster's --max-model-len, registered by each agent
    cases = [
        ({"prompt": [7] * (window + 1), "max_tokens": 1}, "input tokens"),
        # More characters than 4096 of the tokenizer's longest tokens: not even tokenized.
        ({"prompt": "a" * 300_000, "max_tokens": 1}, "characters"),
    ]
    for body, says in cases:
        result = generate(sim_cluster.router_url, "/v1/completions", {"model": MODEL, **body})
        assert result.status == 400, result.body
        error = result.body["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
        assert says in error["message"]
    assert routed() == before, "no worker was chosen for a refused prompt"
    # An output cap past the context left is clamped, as vLLM does, not refused.
    fits = {"model": MODEL, "prompt": [7] * (window - 10), "max_tokens": 50, "ignore_eos": True}
    result = generate(sim_cluster.router_url, "/v1/completions", fits)
    assert result.status == 200 and result.body["usage"]["completion_tokens"] == 10


def test_a_consumer_sim_refuses_kv_that_belongs_to_another_prompt(sim_cluster):
    """So a router that hands a decode the wrong handoff fails the fast tier, where a
    real vLLM would pull the blocks and generate from the wrong prompt."""
    producer = sim_cluster.worker("prefill-0").engine_url
    consumer = sim_cluster.worker("decode-0").engine_url

    def handoff(prompt: str) -> dict:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1,
                "kv_transfer_params": PREFILL_REQUEST_PARAMS}  # fmt: skip
        return httpx.post(producer + "/v1/completions", json=body, timeout=30).json()[
            "kv_transfer_params"
        ]

    prompt = "the prompt whose KV was computed " * 20
    for decode_prompt, status in ((prompt, 200), ("a different prompt " * 20, 500)):
        body = {"model": MODEL, "prompt": decode_prompt, "max_tokens": 2,
                "kv_transfer_params": handoff(prompt)}  # fmt: skip
        answer = httpx.post(consumer + "/v1/completions", json=body, timeout=30)
        assert answer.status_code == status, answer.text
    assert "another prompt's" in answer.json()["error"]["message"]


def test_the_router_and_every_worker_listen_on_loopback_only(sim_cluster):
    """``pdserve up``'s defaults: the router, agents, sims and their KV event publishers
    bind 127.0.0.1 (the engines' pull endpoint carries KV, the events carry token ids)."""
    roots = [sim_cluster.router.pid, *(agent.pid for agent in sim_cluster.agents.values())]
    found = listeners(roots)
    ports = {port for _, _, _, port in found}
    assert sim_cluster.plan.port in ports  # the router's own socket was seen
    assert {w.engine_port for w in sim_cluster.workers} <= ports
    assert beyond_loopback(found) == []


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def migrations(cluster, outcome: str) -> float:
    return total(scrape(cluster.router_url + "/metrics"), "pdserve_stream_migrations_total",
                 outcome=outcome)  # fmt: skip


@pytest.mark.parametrize(
    ("path", "sampling"),
    [(COMPLETIONS, {"temperature": 0}), (CHAT, {"temperature": 0}),
     # The fast tier's 2 minutes: the cases above cover both endpoints, greedy.
     pytest.param(CHAT, {"temperature": 0.8, "seed": 7, "return_token_ids": True},
                  marks=pytest.mark.slow),
     pytest.param(COMPLETIONS, {"temperature": 0, "return_token_ids": True},
                  marks=pytest.mark.slow),
     pytest.param(COMPLETIONS, {"temperature": 0.8, "seed": 7}, marks=pytest.mark.slow)],
    ids=["greedy", "chat greedy", "chat seeded with ids", "greedy with token ids", "seeded"],
)  # fmt: skip
def test_a_stream_whose_decode_dies_mid_answer_goes_on_elsewhere_with_nothing_lost(
    sim_cluster, path, sampling
):
    asked = {"prompt": "Once upon a time"} if path == COMPLETIONS else {
        "messages": [{"role": "user", "content": "Once upon a time"}]}  # fmt: skip
    body = {"model": MODEL, "max_tokens": 200, "stream": True,
            "stream_options": {"include_usage": True}, **asked, **sampling}  # fmt: skip
    reference = generate(sim_cluster.router_url, path, body)
    assert reference.done and reference.usage["completion_tokens"] == 200
    before, migrated_before = sim_cluster.worker_status(), migrations(sim_cluster, "migrated")
    killed: list[str] = []

    def kill_the_decode_at_chunk_50(so_far) -> None:
        if so_far.chunks == 50:
            killed.append(serving_decode(sim_cluster))
            os.kill(before[killed[0]]["engine_pid"], signal.SIGKILL)

    moved = generate(sim_cluster.router_url, path, body, on_chunk=kill_the_decode_at_chunk_50)
    assert killed, "the stream ended before its decode could be killed"
    assert moved.status == 200 and moved.done and not moved.error_events
    assert moved.text == reference.text
    assert moved.token_ids == reference.token_ids  # empty unless the client asked for them
    assert moved.usage == reference.usage
    assert len(moved.response_ids) == 1 and moved.response_ids != reference.response_ids
    # One token a chunk (a chat's first names the role): what the client had at the cut.
    tokens_before = moved.chunks_before_migration - (path == CHAT)
    assert moved.migrations == [{"exact": True, "tokens_before": tokens_before}]
    assert reference.migrations == []
    assert migrations(sim_cluster, "migrated") - migrated_before == 1
    wait_for(
        lambda: (w := sim_cluster.worker_status().get(killed[0])) is not None
        and w["eligible"] and w["incarnation"] > before[killed[0]]["incarnation"],
        60, "the agent to restart its sim",
    )  # fmt: skip


@pytest.mark.slow  # a 2x200-token reference and a sim restart; the n=1 cases above are fast
def test_each_choice_of_a_seeded_n2_stream_goes_on_unchanged_when_its_decode_dies(sim_cluster):
    """n > 1 is served one call per choice (``fan_out.py``), so each choice migrates on
    its own: a choice's seed is the request's plus its index, as vLLM samples them."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "n": 2,
            "temperature": 0.8, "seed": 7, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    reference = generate(sim_cluster.router_url, COMPLETIONS, body)
    assert reference.done and len(reference.texts) == 2
    before, migrated_before = sim_cluster.worker_status(), migrations(sim_cluster, "migrated")
    killed: list[str] = []

    def kill_a_decode_at_chunk_50(so_far) -> None:
        if so_far.chunks == 50:
            killed.append(serving_decodes(sim_cluster)[0])
            os.kill(before[killed[0]]["engine_pid"], signal.SIGKILL)

    moved = generate(sim_cluster.router_url, COMPLETIONS, body, on_chunk=kill_a_decode_at_chunk_50)
    assert killed, "the stream ended before a decode could be killed"
    assert moved.status == 200 and moved.done and not moved.error_events
    assert moved.texts == reference.texts and moved.usage == reference.usage
    assert len(moved.response_ids) == 1
    assert moved.migrations and all(m["exact"] for m in moved.migrations)
    assert migrations(sim_cluster, "migrated") - migrated_before >= 1
    wait_for(
        lambda: (w := sim_cluster.worker_status().get(killed[0])) is not None
        and w["eligible"] and w["incarnation"] > before[killed[0]]["incarnation"],
        60, "the agent to restart its sim",
    )  # fmt: skip


@pytest.mark.parametrize(("lost", "left"), [("prefill", "decode"), ("decode", "prefill")])
def test_a_pd_model_that_lost_a_pool_is_served_whole_by_the_other(sim_cluster, lost, left):
    url, body = sim_cluster.router_url, {"model": MODEL, "prompt": "degraded", "max_tokens": 8}
    reference = generate(url, "/v1/completions", body)
    gone = [w.name for w in sim_cluster.workers if w.role == lost]

    def degraded() -> float:
        families = scrape(url + "/metrics")
        return total(families, "pdserve_degraded_requests_total", model=MODEL, pool=left)

    before = degraded()
    try:
        for name in gone:
            sim_cluster.admin("POST", f"/admin/v1/workers/{name}/drain")
        served = generate(url, "/v1/completions", body)
        streamed = generate(url, "/v1/completions", {**body, "stream": True})
        listed = httpx.get(url + "/v1/models").json()["data"]
        status = sim_cluster.admin("GET", "/admin/v1/status")["models"]
    finally:
        for name in gone:
            sim_cluster.admin("POST", f"/admin/v1/workers/{name}/undrain")
    assert served.status == 200 and served.text == reference.text
    assert streamed.done and streamed.text == reference.text
    assert degraded() - before == 2
    assert MODEL in {m["id"] for m in listed}
    assert {m["model"]: m["degraded"] for m in status}[MODEL] == left  # pdserve status says so
    assert generate(url, "/v1/completions", body).text == reference.text
    assert degraded() - before == 2, "both pools back: disaggregated again"
