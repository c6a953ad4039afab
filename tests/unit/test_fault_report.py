"""The fault suite's verdicts and its table: what counts as what, nothing dropped."""

from __future__ import annotations

from benchmarks.fault_report import markdown, recovery
from benchmarks.faults import judge
from loadgen.client import RequestResult


def result(status: int = 200, error: str | None = None, text: str = "the answer") -> RequestResult:
    return RequestResult(started_s=0.0, status=status, error=error, text=text)


def test_each_way_a_request_can_end_is_judged():
    assert judge(result(), "the answer") == "complete"
    assert judge(result(text="the ans"), "the answer") == "truncated"  # a 200 cut short
    assert judge(result(error="truncated: no [DONE]"), "the answer") == "truncated"
    assert judge(result(error='stream error: {"error": {}}'), "the answer") == "error"
    assert judge(result(status=503, error="HTTP 503: ..."), "the answer") == "error"
    assert judge(result(error="ServerTimeoutError: Timeout on reading data"), "x") == "hang"
    # A broken connection: the client sees an error, but no SSE error event was sent.
    assert judge(result(error="ClientPayloadError: Response payload is not completed"),
                 "x") == "cut"  # fmt: skip
    assert judge(result(status=0, error="ClientConnectorError: refused"), "x") == "cut"


def test_injections_that_never_recovered_are_counted_not_dropped():
    scenario = {"injections": [{"served_s": 1.0}, {"served_s": 3.0}, {"served_s": None}]}
    assert recovery(scenario, "served_s") == (2.0, 3.0, 1)
    report = {
        "title": "t", "command": "c", "date": "d", "clients": 2,
        "machine": {"commit": "abc", "cpu_model": "cpu", "cores": 2},
        "scenarios": [{
            "scenario": "kill_decode", "what": "w", "requests": 5, "errors": {"HTTP 502": 1},
            "worst_wait_s": 2.5,
            "outcomes": {"complete": 4, "error": 1, "truncated": 0, "hang": 0, "cut": 0},
            "outcomes_by_replica": [{"complete": 3, "error": 1, "truncated": 0, "hang": 0,
                                     "cut": 0}, {"complete": 1, "error": 0, "truncated": 0,
                                                 "hang": 0, "cut": 0}],
            "injections": [{"served_s": 1.0, "whole_s": None}], "kv_settled_s": {"d0": 0.4},
        }],
    }  # fmt: skip
    table = markdown(report)
    row = "| kill_decode | 1 | 5 | 4 | 1 | 0 | 0 | 0 | 2.5 | 1.0 / 1.0 | - (1 never) | 0.4 |"
    assert row in table
    assert "replica 0: 3 / 1 / 0 / 0 / 0; replica 1: 1 / 0 / 0 / 0 / 0" in table
    assert "1 x `HTTP 502`" in table
