"""Engines that schedule by priority get the request's class; clients cannot set it."""

from __future__ import annotations

import json

import pytest

from contracts.workers import WorkerRegistration, WorkerRole
from router.admission.tenants import PRIORITIES
from router.fleet.registry import WorkerState
from router.orchestration.engine_body import engine_json
from router.orchestration.orchestrate import prefill_body
from router.prepare.prepare import Endpoint, prepare


def worker(policy: str) -> WorkerState:
    registration = WorkerRegistration(worker_id=f"w-{policy}", role=WorkerRole.PREFILL,
                                      model="m", engine_url="http://e",
                                      scheduling_policy=policy)  # fmt: skip
    return WorkerState(registration, 0.0)


def client_request(priority_header: str | None, **extra: object):
    body = {"model": "m", "prompt": "hi", "max_tokens": 4, **extra}
    return prepare(
        Endpoint.COMPLETIONS, body, max_tokens_cap=64, aliases={}, served_models={"m"},
        arrived_s=0.0, priority_header=priority_header,
    )  # fmt: skip


@pytest.mark.parametrize("header", [None, "batch"])
def test_a_priority_engine_is_told_the_class_and_a_first_come_one_nothing(header):
    request = client_request(header, priority=-50)  # a client's own priority is dropped
    assert "priority" not in request.body
    told = json.loads(engine_json(prefill_body(request.body), request, worker("priority")))
    assert told["priority"] == request.priority == PRIORITIES.index(header or "standard")
    assert told["max_tokens"] == 1  # the rest of the engine body is untouched
    assert "priority" not in json.loads(engine_json(request.body, request, worker("fcfs")))


def test_batch_lines_go_after_every_interactive_class():
    assert client_request("batch").priority > max(
        client_request(None).priority, client_request("interactive").priority
    )
