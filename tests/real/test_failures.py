"""Failures on the real path: a dead prefill, a decode killed mid-stream, a client that leaves."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from agent.engine_dtype import choose_dtype
from contracts.machine import read_cpu
from loadgen.prometheus_text import scrape, scrape_or_none, total
from localrun.ports import free_ports
from tests.clusters import MODEL
from tests.conditions import wait_for
from tests.generation import Generation, generate
from tests.kv_held import a_refused_handoff_frees_its_blocks

LONG_STREAM = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0, "stream": True}


def test_failed_prefill_is_retried_on_another_prefill_worker(cluster, router_url):
    (dead_port,) = free_ports(1)
    dead = {
        "worker_id": "prefill-dead",
        "role": "prefill",
        "model": MODEL,
        "engine_url": f"http://127.0.0.1:{dead_port}",  # nothing listens: connection refused
    }

    def retries() -> float:
        return total(scrape(router_url + "/metrics"), "pdserve_prefill_retries_total")

    before = retries()
    statuses = []
    try:
        # Round-robin meets the dead worker within two requests, unless the router's own
        # health probe takes it out first; registering again puts it back in rotation.
        for _ in range(10):
            cluster.admin("POST", "/admin/workers/register", dead, as_worker="prefill-dead")
            for _ in range(2):
                body = {"model": MODEL, "prompt": "retry me", "max_tokens": 4}
                result = generate(router_url, "/v1/completions", body)
                statuses.append(result.status)
            if retries() > before:
                break
        assert set(statuses) == {200}
        assert retries() > before
        # Unreachable: its circuit opened at once, whatever its health probes said yet.
        assert cluster.worker_status()["prefill-dead"]["circuit"] == "open"
    finally:
        cluster.admin("DELETE", "/admin/workers/prefill-dead", as_worker="prefill-dead")


def test_a_handoff_a_decode_refuses_is_freed_on_its_producer_at_once(cluster, decode_engine_url):
    """vLLM's consumer tells the producer to free a refused request's handoff: the router's
    way to free KV no decode will pull (``kv_release.py``) long before the 30 s lease."""
    prefill_url = cluster.worker("prefill-0").engine_url
    a_refused_handoff_frees_its_blocks(prefill_url, decode_engine_url, MODEL, freed_within_s=10)


def test_client_disconnect_aborts_the_decode_request(router_url, decode_engine_url):
    def decode_gauges() -> tuple[float, float]:
        # A starved engine can take longer than a default scrape timeout to answer.
        samples = scrape_or_none(decode_engine_url + "/metrics", timeout_s=15)
        if samples is None:
            return float("inf"), float("nan")  # no answer yet: not idle
        return (
            total(samples, "vllm:num_requests_running"),
            total(samples, "vllm:generation_tokens_total"),
        )

    generated_before = total(
        scrape(decode_engine_url + "/metrics", timeout_s=15), "vllm:generation_tokens_total"
    )
    body = {"model": MODEL, "prompt": "a long story", **LONG_STREAM}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", router_url + "/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert sum(1 for line, _ in zip(lines, range(6), strict=False) if line) >= 3
    wait_for(lambda: decode_gauges()[0] == 0, 120, "decode to end the orphaned request")
    # Had it run to the end, decode would have generated every one of max_tokens.
    generated = decode_gauges()[1] - generated_before
    assert 0 < generated < LONG_STREAM["max_tokens"] / 2


def kill_the_decode_and_wait_for_its_restart(
    cluster,
    router_url: str,
    path: str,
    body: dict,
    how: signal.Signals = signal.SIGKILL,
    text_at_kill: list[str] | None = None,
) -> Generation:
    """Stream ``body``, signal the decode engine at the 50th chunk; what the client got,
    once the agent has restarted vLLM (a new incarnation) and the router serves again.
    The text the client had at the kill goes into ``text_at_kill``."""
    decode = cluster.worker_status()["decode-0"]

    def kill_at_chunk_50(so_far: Generation) -> None:
        if so_far.chunks == 50:
            if text_at_kill is not None:
                text_at_kill.append(so_far.text)
            os.kill(decode["engine_pid"], how)

    result = generate(router_url, path, body, on_chunk=kill_at_chunk_50)
    assert result.chunks >= 50, "the stream must have started before the kill"
    wait_for(
        lambda: (
            (w := cluster.worker_status().get("decode-0")) is not None
            and w["eligible"]
            and w["incarnation"] > decode["incarnation"]
        ),
        300,
        "the decode agent to restart its engine",
    )
    again = generate(router_url, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "again"}], "max_tokens": 4,
    })  # fmt: skip
    assert again.status == 200 and again.text
    return result


def continuations_are_exact() -> bool:
    """Whether a greedy continuation re-prefilled on another worker picks the tokens the
    token-by-token decode would have: with the engines in float32 on CPU, yes. In bf16
    (a CPU with avx512_bf16 or AMX), no: prefill and decode round differently, and vLLM
    0.32's batch-invariant mode is GPU-only. The router checks what it replays against
    what the client got (``migration_diverged`` otherwise), but cannot check the rest."""
    return choose_dtype(device="cpu", cpu=read_cpu()).dtype == "float32"


@pytest.mark.parametrize(
    ("how", "path", "extra"),
    [(signal.SIGKILL, "/v1/completions", {}), (signal.SIGTERM, "/v1/chat/completions", {}),
     # vLLM holds back text that could begin a stop string: the stream is replayed.
     (signal.SIGKILL, "/v1/completions", {"stop": ["~never in this text~"]})],
    ids=["SIGKILL completion", "SIGTERM chat", "SIGKILL completion with a stop string"],
)  # fmt: skip
def test_a_greedy_stream_whose_decode_is_killed_at_token_50_completes_unchanged(
    cluster, router_url, how, path, extra
):
    """SIGKILL breaks the stream; SIGTERM makes vLLM abort it (finish_reason "abort", then
    [DONE]). Either way it goes on on the prefill worker, unchanged; a chat's as a
    completion of its templated prompt, rewritten into chat chunks."""
    asked = {"prompt": "tell me everything"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "tell me everything"}]}  # fmt: skip
    body = {"model": MODEL, "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **asked,
            **extra}  # fmt: skip
    uninterrupted = generate(router_url, path, body)
    assert uninterrupted.done and uninterrupted.usage["completion_tokens"] == 200
    migrated_before = total(scrape(router_url + "/metrics"), "pdserve_stream_migrations_total",
                            outcome="migrated")  # fmt: skip
    at_kill: list[str] = []
    moved = kill_the_decode_and_wait_for_its_restart(cluster, router_url, path, body, how, at_kill)
    if moved.error_events and not continuations_are_exact():
        # bf16: the replay itself may choose another token than the client got; the
        # stream then ends in migration_diverged, never in different text.
        assert [e["error"]["code"] for e in moved.error_events] == ["migration_diverged"]
        assert uninterrupted.text.startswith(moved.text)
        return
    assert moved.status == 200 and moved.done and not moved.error_events, moved.error_events
    assert moved.usage == uninterrupted.usage
    if continuations_are_exact():
        assert moved.text == uninterrupted.text
    else:  # what the client had is kept; what follows is the prefill worker's own greedy
        assert at_kill and uninterrupted.text.startswith(at_kill[0])
        assert moved.text.startswith(at_kill[0]) and len(moved.text) > len(at_kill[0])
    assert len(moved.response_ids) == 1
    assert [m["exact"] for m in moved.migrations] == [True]
    migrated = total(scrape(router_url + "/metrics"), "pdserve_stream_migrations_total",
                     outcome="migrated")  # fmt: skip
    assert migrated - migrated_before == 1


# Letters and spaces only, longer than max_tokens allows: cut at chunk 50, ended by length.
GRAMMAR = {"structured_outputs": {"regex": "[a-z ]{2000}"}}


@pytest.mark.parametrize(
    ("path", "extra"),
    [("/v1/chat/completions", GRAMMAR), ("/v1/completions", GRAMMAR)],
    ids=["chat under a grammar", "completion under a grammar"],
)  # fmt: skip
def test_a_guided_greedy_stream_whose_decode_is_killed_is_replayed_unchanged(
    cluster, router_url, path, extra
):
    """A grammar's state comes back only from a run from the start: the same request
    again elsewhere, less what the client already got (a chat as the chat again,
    ``chat_replay.py``). Tool calls take that same chat path; vLLM parses them only with
    a --tool-call-parser, which these engines do not run: ``test_chat_replay.py`` checks
    their deltas."""
    asked = {"prompt": "write"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "write"}]}  # fmt: skip
    body = {"model": MODEL, "max_tokens": 200, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **asked, **extra}  # fmt: skip
    uninterrupted = generate(router_url, path, body)
    assert uninterrupted.done and uninterrupted.chunks > 60, uninterrupted
    moved = kill_the_decode_and_wait_for_its_restart(cluster, router_url, path, body)
    assert moved.status == 200 and moved.done and not moved.error_events, moved.error_events
    assert moved.text == uninterrupted.text
    assert moved.usage == uninterrupted.usage
    assert len(moved.response_ids) == 1
    assert [m["exact"] for m in moved.migrations] == [True]


def test_an_unseeded_sampled_stream_whose_decode_dies_ends_in_an_error_event(cluster, router_url):
    """Its continuation could not be the text it would have been: no migration."""
    body = {"model": MODEL, "prompt": "tell me everything", "max_tokens": 3000,
            "temperature": 0.8, "ignore_eos": True, "stream": True}  # fmt: skip
    result = kill_the_decode_and_wait_for_its_restart(cluster, router_url, "/v1/completions", body)
    assert result.status == 200 and not result.done
    assert [e["error"]["code"] for e in result.error_events] in (
        ["stream_broken"],
        ["stream_truncated"],
    )
