"""The pure parts behind the metrics, on a fake clock: windowed sums and samples, the
heartbeat accounting of worker-seconds, cost and engine counters, usage parsing, and
the log formats."""

from __future__ import annotations

import json
import logging

import pytest

from contracts.logs import JsonFormatter, configure_logging, request_id_from, request_id_var
from contracts.workers import WorkerHeartbeat, WorkerLoad, WorkerRegistration, WorkerRole
from router.observability.cost import parse_prices, usd_per_hour
from router.observability.fleet_accounting import FleetAccounting, PoolKey
from router.observability.windows import RecentSamples, SlidingSums
from router.orchestration.usage import (
    Usage,
    usage_in_answer,
    usage_in_events,
    usage_in_large_answer,
    with_usage_requested,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sliding_sums_forget_what_left_the_window_and_divide_by_true_age():
    clock = Clock()
    sums = SlidingSums(window_s=10, bucket_s=1, clock=clock)
    sums.add("k", 5)
    clock.now += 4
    sums.add("k", 3)
    assert sums.total("k") == 8
    assert sums.span_s() == 4  # younger than the window: its true age
    clock.now += 7  # the first add is now 11 s old
    assert sums.total("k") == 3
    assert sums.span_s() == 10
    clock.now += 100
    assert sums.total("k") == 0 and sums.total("never") == 0


def test_sliding_sums_hold_at_most_a_window_of_buckets():
    clock = Clock()
    sums = SlidingSums(window_s=5, bucket_s=1, clock=clock)
    for _ in range(1000):
        sums.add("k", 1)
        clock.now += 0.5
    assert len(sums._sums["k"]) <= 6
    assert sums.total("k") == pytest.approx(10, abs=2)


def test_recent_samples_quantiles_are_nearest_rank_over_the_window_and_bounded():
    clock = Clock()
    samples = RecentSamples(window_s=60, max_samples=100, clock=clock)
    assert samples.quantiles("m", (0.5,)) is None
    for value in range(1, 201):  # only the newest 100 are kept: 101..200
        samples.add("m", float(value))
    assert samples.count("m") == 100
    assert samples.quantiles("m", (0.5, 0.99, 1.0)) == (150.0, 199.0, 200.0)
    clock.now += 61
    assert samples.quantiles("m", (0.5,)) is None


def registration(worker_id: str = "d0", role: WorkerRole = WorkerRole.DECODE,
                 incarnation: int = 1, accelerator: str = "cpu") -> WorkerRegistration:  # fmt: skip
    return WorkerRegistration(worker_id=worker_id, role=role, model="m",
                              engine_url="http://127.0.0.1:1", incarnation=incarnation,
                              accelerator=accelerator)  # fmt: skip


def beat(reg: WorkerRegistration, ready: bool = True, known: bool = True, **load: float):
    return WorkerHeartbeat(worker_id=reg.worker_id, ready=ready, incarnation=reg.incarnation,
                           load=WorkerLoad(known=known, **load))  # fmt: skip


def accounting(clock: Clock, prices: dict[str, float] | None = None) -> FleetAccounting:
    window = SlidingSums(window_s=3600, bucket_s=1, clock=clock)
    return FleetAccounting(prices or {"default": 3.6}, max_gap_s=10, window=window, clock=clock)


def test_worker_seconds_and_cost_accrue_between_heartbeats_capped_by_the_gap():
    clock = Clock()
    books = accounting(clock, {"default": 3.6, "gpu": 36.0})
    cpu, gpu = registration("d0"), registration("d1", accelerator="gpu")
    books.registered(cpu)
    books.registered(gpu)
    clock.now += 2
    books.heartbeat(cpu, beat(cpu))
    books.heartbeat(gpu, beat(gpu))
    clock.now += 60  # silent past max_gap_s: only 10 s count
    books.heartbeat(cpu, beat(cpu))
    key = PoolKey("m", "decode")
    assert books.worker_seconds[key, "cpu"] == 12
    assert books.worker_seconds[key, "gpu"] == 2
    assert books.cost_usd[key] == pytest.approx(12 * 3.6 / 3600 + 2 * 36 / 3600)
    assert books.window_cost_usd(key) == pytest.approx(books.cost_usd[key])


def test_engine_counters_grow_by_deltas_and_survive_restarts_and_blind_beats():
    clock = Clock()
    books = accounting(clock)
    reg = registration()
    books.registered(reg)
    books.heartbeat(reg, beat(reg, kv_transfers=3, prefix_cache_queries=100))
    books.heartbeat(reg, beat(reg, known=False))  # /metrics unreadable: zeros, not counts
    books.heartbeat(reg, beat(reg, ready=False))
    books.heartbeat(reg, beat(reg, kv_transfers=5, prefix_cache_queries=160))
    restarted = registration(incarnation=2)  # the engine restarted: its counters did too
    books.heartbeat(restarted, beat(restarted, kv_transfers=1, prefix_cache_queries=10))
    counters = books.engine[PoolKey("m", "decode")]
    assert counters["kv_transfers"] == 6
    assert counters["prefix_cache_queries"] == 170


def test_a_restarted_router_takes_the_first_heartbeat_as_the_baseline():
    clock = Clock()
    books = accounting(clock)
    reg = registration()
    books.heartbeat(reg, beat(reg, kv_transfers=500))  # never saw it register
    clock.now += 1
    books.heartbeat(reg, beat(reg, kv_transfers=502))
    assert books.engine[PoolKey("m", "decode")]["kv_transfers"] == 2
    assert books.worker_seconds[PoolKey("m", "decode"), "cpu"] == 1


def test_prices_parse_and_refuse_bad_entries():
    prices = parse_prices('{"default": 0.1, "nvidia-h100": 2.5}')
    assert usd_per_hour(prices, "nvidia-h100") == 2.5 and usd_per_hour(prices, "cpu") == 0.1
    assert usd_per_hour(parse_prices("{}"), "cpu") == 0.0
    for bad in ("[1]", '{"cpu": -1}', '{"cpu": "1"}', "{", '{"cpu": true}'):
        with pytest.raises(ValueError):
            parse_prices(bad)


def test_a_large_answers_usage_is_read_from_its_tail_or_else_from_the_whole():
    vectors = b'"data": [{"index": 0, "embedding": [0.5, 0.25]}]'
    usage = b'"usage": {"prompt_tokens": 9, "total_tokens": 9, "completion_tokens": 0}'
    assert usage_in_large_answer(b'{"id": "e", ' + vectors + b", " + usage + b"}") == Usage(9, 0)
    last_but_one = b'{"id": "e", ' + usage + b", " + vectors + b"}"
    assert usage_in_large_answer(last_but_one) == Usage(9, 0)
    assert usage_in_large_answer(b'{"id": "e", ' + vectors + b"}") is None


def test_usage_is_read_from_answers_and_streams_and_stripped_when_not_asked():
    answer = b'{"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}'
    assert usage_in_answer(answer) == Usage(7, 3)
    assert usage_in_answer(b'{"id": "x"}') is None and usage_in_answer(b"not json") is None
    events = (b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
              b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}\n\n'
              b"data: [DONE]\n\n")  # fmt: skip
    usage, kept = usage_in_events(events, strip=True)
    assert usage == Usage(5, 2)
    assert b"usage" not in kept and kept.endswith(b"data: [DONE]\n\n") and b'"hi"' in kept
    usage, kept = usage_in_events(events, strip=False)
    assert usage == Usage(5, 2) and kept == events
    # A content chunk that merely says "usage" is relayed untouched.
    chatter = b'data: {"choices": [{"delta": {"content": "\\"usage\\""}}]}\n\n'
    assert usage_in_events(chatter, strip=True) == (None, chatter)


def test_streams_ask_the_engine_for_usage_and_remember_whether_the_client_did():
    asked, client_did = with_usage_requested({"stream": True})
    assert asked["stream_options"] == {"include_usage": True} and not client_did
    body = {"stream": True, "stream_options": {"include_usage": True}}
    assert with_usage_requested(body) == (body, True)
    kept, _ = with_usage_requested({"stream_options": {"continuous_usage_stats": True}})
    assert kept["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


def test_request_ids_are_kept_when_safe_and_replaced_otherwise():
    assert request_id_from("trace-1:abc.2") == "trace-1:abc.2"
    for unsafe in (None, "", "two words", "x" * 129, "new\nline"):
        replaced = request_id_from(unsafe)
        assert replaced != unsafe and len(replaced) == 32


@pytest.fixture
def root_logging():
    """configure_logging replaces the root handlers: give pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_logs_carry_the_request_id_and_human_logs_append_it(capsys, root_logging):
    configure_logging("router", log_format="json")
    token = request_id_var.set("rid-9")
    try:
        logging.getLogger("pdserve.test").warning("decode-0 attempt failed")
    finally:
        request_id_var.reset(token)
    entry = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert entry["request_id"] == "rid-9" and entry["process"] == "router"
    assert entry["message"] == "decode-0 attempt failed" and entry["level"] == "WARNING"
    configure_logging("router", log_format="human")
    token = request_id_var.set("rid-10")
    try:
        logging.getLogger("pdserve.test").warning("plain")
    finally:
        request_id_var.reset(token)
    assert capsys.readouterr().err.strip().endswith("plain [request_id=rid-10]")
    record = logging.LogRecord("x", logging.INFO, "f", 1, "no id", None, None)
    assert "request_id" not in json.loads(JsonFormatter("agent").format(record))
    with pytest.raises(SystemExit):
        configure_logging("router", log_format="xml")
