"""Engine thread placement: the /proc reader, the rules, and the engine start-up pin."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from agent.engine_spec import ENGINE_SITE_DIR
from agent.placement import (
    ExpectedPlacement,
    ThreadPlacement,
    cpu_violations,
    parse_cpu_list,
    placement_violations,
    process_tree,
    read_threads,
)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", {0}), ("0-1", {0, 1}), ("0-2,5", {0, 1, 2, 5}), (" 3 \n", {3}), ("", set())],
)
def test_parse_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus


def thread(pid, tid, cpus, title="python -m vllm", name="python"):
    return ThreadPlacement(
        pid=pid, tid=tid, process_title=title, thread_name=name, cpus=frozenset(cpus)
    )


# What /proc showed on a 2-core box with vLLM 0.32's NixlConnector unpatched: the
# prefill engine (assigned core 0) had its worker's model thread on core 1.
MISPLACED_PREFILL = [
    thread(10, 10, {0, 1}),
    thread(12, 12, {0, 1}, title="VLLM::EngineCore"),
    thread(13, 13, {1}, title="VLLM::Worker"),
    thread(13, 14, {0}, title="VLLM::Worker", name="VLLM::Worker"),
]


def test_the_observed_misplacement_is_caught_thread_by_thread():
    problems = cpu_violations(
        MISPLACED_PREFILL, ExpectedPlacement(cpus=frozenset({0}), model_thread_cpu=0)
    )
    assert len(problems) == 4  # api server, engine core, model thread off core 0; model thread
    assert any("model thread of pid 13" in p and "not its OpenMP core 0" in p for p in problems)


def test_model_thread_on_the_wrong_core_inside_the_assignment_is_caught():
    # Assigned 0-1: the NIXL reservation put the model thread on 1, where OpenMP's
    # second thread already computes, leaving core 0 without a compute thread.
    threads = [thread(13, 13, {1}, title="VLLM::Worker"), thread(13, 14, {1})]
    expected = ExpectedPlacement(cpus=frozenset({0, 1}), model_thread_cpu=0)
    assert [p for p in cpu_violations(threads, expected) if "OpenMP core 0" in p]


def test_a_well_placed_engine_passes_and_a_missing_worker_is_reported():
    placed = [thread(10, 10, {0}), thread(13, 13, {0}, title="VLLM::Worker")]
    expected = ExpectedPlacement(cpus=frozenset({0}), model_thread_cpu=0)
    assert cpu_violations(placed, expected) == []
    assert cpu_violations(placed[:1], expected) == [
        "no VLLM::Worker process found: cannot check the model thread"
    ]


def test_engine_site_pins_every_thread_and_child_of_the_engine():
    """A real interpreter started the way the agent starts engines: the pin reaches a
    thread it starts and a child it forks, and the reader sees exactly that."""
    # The forked child reads the raw descriptor: sys.stdin's lock, held by the thread
    # blocked in sys.stdin.read() at the fork, is never released in the child, whose
    # sys.stdin.read() would then wait forever (it did, for hours after the suite ended).
    code = (
        "import os, threading, sys\n"
        "threading.Thread(target=sys.stdin.read, daemon=True).start()\n"
        "if os.fork() == 0:\n    while os.read(0, 4096): pass\n    os._exit(0)\n"
        "print('up', flush=True); sys.stdin.read()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ENGINE_SITE_DIR), PDSERVE_ENGINE_CPUS="0")
    child = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    pids = [child.pid]
    try:
        assert child.stdout.readline() == b"up\n"
        pids = process_tree(child.pid)
        threads = read_threads(pids)
        assert len(pids) == 2 and len(threads) >= 3
        assert {t.cpus for t in threads} == {frozenset({0})}
        assert placement_violations(child.pid, ExpectedPlacement(cpus=frozenset({0}))) == []
        if len(os.sched_getaffinity(0)) > 1:
            wrong = placement_violations(child.pid, ExpectedPlacement(cpus=frozenset({1})))
            assert len(wrong) == len(threads)
    finally:
        child.stdin.close()  # the forked child reads to EOF and exits
        for pid in pids:  # and were it stuck, it goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait()
