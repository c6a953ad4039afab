"""The Files and Batch API on a sim P/D cluster, through the official ``openai`` SDK:
a batch end to end (every line answered as the same request sent alone is), a line the
model refuses in the error file, bad input failing validation with line numbers,
uploads past the cap, tenancy, and a cancel mid-batch."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest

from localrun.cluster import LocalCluster
from router.fleet.planner_feed import batch_due, parse_metrics
from tests.clusters import MODEL, small_sim_cluster
from tests.conditions import wait_for

# Slow tier: a sim P/D cluster running several batches (about 20 CPU-seconds); the
# batch tier's parts alone are in the fast tier (tests/unit/test_batch_parts.py).
pytestmark = pytest.mark.slow

MAX_FILE_BYTES = 256 * 1024
TENANTS = {"alice": {"keys": ["key-alice"]}, "bob": {"keys": ["key-bob"]}}
ENDED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    router_env = {
        "PDSERVE_TENANTS": json.dumps(TENANTS),
        "PDSERVE_BATCH_POLL_S": "0.2",
        "PDSERVE_MAX_FILE_BYTES": str(MAX_FILE_BYTES),
    }
    with small_sim_cluster(tmp_path_factory.mktemp("batches"), router_env=router_env) as local:
        yield local


def client(cluster: LocalCluster, key: str = "key-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=key, max_retries=0)


def line(i: int, **body: object) -> dict:
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/completions",
        "body": {
            "model": MODEL,
            "prompt": f"batch line {i} says",
            "max_tokens": 4,
            "temperature": 0,
            **body,
        },
    }


def jsonl(lines: list) -> bytes:
    return b"".join((x if isinstance(x, str) else json.dumps(x)).encode() + b"\n" for x in lines)


def run(api: openai.OpenAI, lines: list, timeout_s: float = 90):
    uploaded = api.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    batch = api.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/completions",
        completion_window="24h",
        metadata={"test": "batches"},
    )
    assert batch.status == "validating"
    wait_for(lambda: api.batches.retrieve(batch.id).status in ENDED, timeout_s, "batch ended")
    return api.batches.retrieve(batch.id)


def metric_lines(cluster: LocalCluster, needle: str) -> list[str]:
    text = httpx.get(cluster.router_url + "/metrics", timeout=10).text
    return [x for x in text.splitlines() if needle in x and not x.startswith("#")]


def lines_of(api: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in api.files.content(file_id).text.splitlines()]


def test_a_batch_runs_end_to_end_through_the_sdk(cluster):
    api = client(cluster)
    done = run(api, [line(i) for i in range(12)])
    assert done.status == "completed", done
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (12, 12, 0)
    assert done.error_file_id is None and done.metadata == {"test": "batches"}
    out = lines_of(api, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"req-{i}" for i in range(12))
    for answer in out[:3]:  # each as the same request alone (greedy)
        body = line(int(answer["custom_id"].split("-")[1]))["body"]
        alone = api.completions.create(**body)
        assert answer["response"]["status_code"] == 200
        assert answer["response"]["body"]["choices"][0]["text"] == alone.choices[0].text
    assert done.id in [b.id for b in api.batches.list()]
    outputs = [f.id for f in api.files.list(purpose="batch_output")]
    assert done.output_file_id in outputs


def test_a_line_the_model_refuses_goes_to_the_error_file(cluster):
    api = client(cluster)
    too_long = line(1, prompt="word " * 6000)  # past the model's context: a 400 when it runs
    done = run(api, [line(0), too_long])
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    (failed,) = lines_of(api, done.error_file_id)
    # Past the context (400); or, once line 0 has taught admission the worker's speed,
    # forecast past the TTFT SLO from its head before it is tokenized whole (413).
    refused = (failed["response"]["status_code"], failed["response"]["body"]["error"]["code"])
    assert failed["custom_id"] == "req-1"
    assert refused in {(400, "context_length_exceeded"), (413, "prompt_exceeds_ttft_slo")}


def test_bad_input_fails_validation_naming_every_line(cluster):
    api = client(cluster)
    wrong_url = {**line(3), "url": "/v1/chat/completions"}
    no_body = {k: v for k, v in line(5).items() if k != "body"}
    done = run(
        api,
        [
            line(0),
            "{not json",
            line(0),
            wrong_url,
            line(4, model="no-such-model"),
            no_body,
            line(6, stream=True),
            line(7, max_tokens=-1),
        ],
    )
    assert done.status == "failed" and done.output_file_id is None
    found = [(e.line, e.code) for e in done.errors.data]
    assert found == [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "invalid_url"),
        (5, "model_not_found"),
        (6, "missing_required_parameter"),
        (7, "streaming_unsupported"),
        (8, "invalid_request"),
    ]
    assert done.errors.data[-1].param == "body.max_tokens"  # as the endpoint names it
    assert done.request_counts.total == 0  # nothing ran


def test_uploads_past_the_cap_are_413_and_nothing_is_kept(cluster):
    api = client(cluster)
    before = [f.id for f in api.files.list()]
    with pytest.raises(openai.APIStatusError) as refused:
        api.files.create(file=("big.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch")
    assert refused.value.status_code == 413
    with pytest.raises(openai.BadRequestError):
        api.files.create(file=("input.csv", jsonl([line(0)])), purpose="batch")
    assert [f.id for f in api.files.list()] == before


def test_a_tenant_sees_only_its_own_files_and_batches(cluster):
    alice, bob = client(cluster), client(cluster, "key-bob")
    uploaded = alice.files.create(file=("mine.jsonl", jsonl([line(0)])), purpose="batch")
    batch = alice.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    lookups = (
        lambda: bob.files.retrieve(uploaded.id),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.files.content(uploaded.id),
        lambda: bob.batches.cancel(batch.id),
    )
    for lookup in lookups:
        with pytest.raises(openai.NotFoundError):
            lookup()
    with pytest.raises(openai.NotFoundError):  # nor use alice's file as its input
        bob.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
        )
    assert uploaded.id not in [f.id for f in bob.files.list()]
    assert batch.id not in [b.id for b in bob.batches.list()]


def test_a_cancel_mid_batch_keeps_finished_lines_and_runs_no_more(cluster):
    api = client(cluster)
    lines = [line(i, max_tokens=48) for i in range(80)]
    uploaded = api.files.create(file=("slow.jsonl", jsonl(lines)), purpose="batch")
    batch = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    wait_for(
        lambda: api.batches.retrieve(batch.id).request_counts.completed >= 4, 60, "a few lines done"
    )
    with pytest.raises(openai.ConflictError):  # its input, while the batch runs
        api.files.delete(uploaded.id)
    assert api.batches.cancel(batch.id).status == "cancelling"
    wait_for(lambda: api.batches.retrieve(batch.id).status in ENDED, 60, "batch ended")
    done = api.batches.retrieve(batch.id)
    assert done.status == "cancelled"
    finished, not_run = lines_of(api, done.output_file_id), lines_of(api, done.error_file_id)
    ids = [o["custom_id"] for o in finished + not_run]
    assert sorted(ids) == sorted(x["custom_id"] for x in lines)  # each exactly once
    assert 4 <= len(finished) < 80
    assert {o["error"]["code"] for o in not_run} == {"batch_cancelled"}
    assert done.request_counts.completed == len(finished)
    with pytest.raises(openai.ConflictError):
        api.batches.cancel(batch.id)
    assert api.files.delete(uploaded.id).deleted  # ended: its input may go now
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve(uploaded.id)


def test_an_sre_lists_every_tenants_batches_and_cancels_one(cluster):
    alice = client(cluster)
    uploaded = alice.files.create(
        file=("sre.jsonl", jsonl([line(i, max_tokens=48) for i in range(60)])), purpose="batch"
    )
    batch = alice.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )

    def progress() -> dict | None:
        listed = cluster.admin("GET", "/admin/v1/batches")["data"]
        return next((b["progress"] for b in listed if b["id"] == batch.id), None)

    wait_for(lambda: (progress() or {}).get("lines_per_s", 0) > 0, 30, "the batch's pace")
    shown = progress()
    assert 0 < shown["backlog_tokens"] < 60 * (48 + 10)  # output caps and short prompts
    assert 23 * 3600 < shown["seconds_left"] <= 24 * 3600
    assert 1 <= shown["pace_limit"] <= 32
    gauges = metric_lines(cluster, f'batch="{batch.id}"')
    assert any(g.startswith("pdserve_batch_backlog_tokens") for g in gauges)
    # By model, for the SLO planner: its lines pending, and the pace its window needs.
    (pending,) = metric_lines(cluster, f'pdserve_batch_pending_lines{{model="{MODEL}"}}')
    assert 0 < float(pending.rsplit(" ", 1)[1]) <= 60
    (due,) = metric_lines(cluster, f'pdserve_batch_due_lines_per_second{{model="{MODEL}"}}')
    assert 0 < float(due.rsplit(" ", 1)[1]) <= 60 / (23 * 3600)
    # As the planner reads them: a load at that pace, each line its max_tokens long.
    scrape = parse_metrics([httpx.get(cluster.router_url + "/metrics", timeout=10).text], 0.0)
    load = batch_due(scrape, model=MODEL)
    assert load is not None and 0 < load.rate_per_s <= 60 / (23 * 3600)
    assert load.lengths[0][1] == 48
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "admin",
            "--router-url",
            cluster.router_url,
            "--token",
            cluster.admin_token,
            "batches",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    row = next(r for r in listed.splitlines() if r.startswith(batch.id))
    assert " alice " in row and " lines/s, backlog " in row and " min left" in row
    cancelled = cluster.admin("POST", f"/admin/v1/batches/{batch.id}/cancel")
    assert cancelled["status"] == "cancelling"
    wait_for(lambda: alice.batches.retrieve(batch.id).status == "cancelled", 60, "cancelled")
    # Its run here ended: its series are gone; the scan counts it among the cancelled.
    assert metric_lines(cluster, f'batch="{batch.id}"') == []
    wait_for(lambda: metric_lines(cluster, 'pdserve_batches{status="cancelled"}'), 10, "count")
    entries = cluster.admin("GET", "/admin/v1/audit?limit=20")["entries"]
    assert any(e["action"] == "cancel_batch" and e["target"] == batch.id for e in entries)


def test_the_status_view_counts_batches_by_status(cluster):
    before = cluster.admin("GET", "/admin/v1/status")["batches"].get("completed", 0)
    run(client(cluster), [line(0)])  # its own batch: the test holds in any order
    snapshot = cluster.admin("GET", "/admin/v1/status")
    assert snapshot["batches"].get("completed", 0) == before + 1


def test_a_batch_that_cannot_meet_its_window_is_flagged_then_expires(cluster):
    api = client(cluster)
    lines = [line(i, max_tokens=32) for i in range(600)]
    uploaded = api.files.create(file=("late.jsonl", jsonl(lines)), purpose="batch")
    batch = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="15s"
    )

    def flagged() -> dict | None:
        listed = cluster.admin("GET", "/admin/v1/batches")["data"]
        return next((b for b in listed if b["id"] == batch.id and b["at_risk"]), None)

    wait_for(lambda: flagged() is not None, 30, "the batch flagged at risk")
    assert flagged()["status"] == "in_progress"  # flagged before it expired
    wait_for(lambda: api.batches.retrieve(batch.id).status in ENDED, 60, "batch ended")
    done = api.batches.retrieve(batch.id)
    assert done.status == "expired" and done.expired_at is not None
    finished, not_run = lines_of(api, done.output_file_id), lines_of(api, done.error_file_id)
    assert sorted(o["custom_id"] for o in finished + not_run) == sorted(
        x["custom_id"] for x in lines
    )
    assert {o["error"]["code"] for o in not_run} == {"batch_expired"}
    metrics = httpx.get(cluster.router_url + "/metrics", timeout=10).text
    assert "pdserve_batches_at_risk_total 1.0" in metrics
