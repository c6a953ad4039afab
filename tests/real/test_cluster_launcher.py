"""``pdserve up`` in ``make run``'s shape (1 prefill + 1 decode) answers a streamed chat
through the disaggregated path, and SIGTERM leaves no process behind. On the way it says
which dtype its engines run and why (and they run it), and lists the model in
``/v1/models`` only once a request to it succeeds (the first worker ready serves alone
until the other is: ``serve_degraded``): before, requests get a 503, never a 500.

Marked ``own_engines``, so it runs before the shared session cluster starts: next
to three busy vLLM engines on two cores, a fourth took over 6 minutes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from agent.engine_dtype import choose_dtype
from contracts.machine import read_cpu
from loadgen.prometheus_text import scrape, total
from localrun.ports import free_ports
from modelstore import tiny_llama
from tests.generation import generate

READY = "ready: OpenAI API at"


@pytest.mark.own_engines
def test_pdserve_up_pd_answers_then_stops_without_orphans(tiny_model, tmp_path):
    (port,) = free_ports(1)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up", "--model", "tiny", "--prefill", "1",
         "--decode", "1", "--port", str(port),
         "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        # The first request sent once the model is listed is the one that must succeed:
        # served by the first worker ready alone (serve_degraded) if the other still loads.
        before = _until_listed(url, launcher, timeout_s=400)
        result = generate(url, "/v1/chat/completions", CHAT)
        assert result.status == 200 and result.done and result.text, _log_tails(tmp_path / "run")
        # Unlisted: 404 while no worker has registered (the router knows no such model),
        # then 503 to retry while none is ready; never a 500. The last chat may find the
        # model ready between the listing it followed and its own send: a 200.
        waiting = before[:-1] if before[-1:] == [200] else before
        assert waiting == sorted(waiting, key=lambda status: status == 503), before
        assert set(waiting) <= {404, 503}, before
        output = _read_until(launcher, "curl -N", timeout_s=400)
        assert READY in output, output[-3000:] + _log_tails(tmp_path / "run")
        _assert_engines_run_the_chosen_dtype(output, tmp_path / "run")
        # Both ready: it goes prefill -> NIXL -> decode, and the decode computes no prompt
        # token of it.
        decode_metrics = _engine_url(tmp_path / "run", "decode") + "/metrics"
        by_source = "vllm:prompt_tokens_by_source_total"

        def decode_prompt_tokens() -> tuple[float, float]:
            samples = scrape(decode_metrics)
            return (total(samples, by_source, source="external_kv_transfer"),
                    total(samples, by_source, source="local_compute"))  # fmt: skip

        pulled_before, computed_before = decode_prompt_tokens()
        result = generate(url, "/v1/chat/completions", CHAT)
        assert result.status == 200 and result.done and result.text
        pulled, computed = decode_prompt_tokens()
        assert pulled > pulled_before and computed == computed_before

        family = psutil.Process(launcher.pid).children(recursive=True)
        assert len(family) >= 5, "router, two agents and their engines must be running"
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=120) == 0
        # The launcher returns only after SIGKILLing every child's process group.
        alive = [p for p in family if _alive(p)]
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        if launcher.poll() is None:
            # A failed test must not leave engines behind: kill the whole tree.
            for process in [*psutil.Process(launcher.pid).children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            launcher.kill()
            launcher.wait()


CHAT = {"model": tiny_llama.SERVED_NAME, "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8, "stream": True}  # fmt: skip


def _until_listed(url: str, launcher: subprocess.Popen, timeout_s: float) -> list[int]:
    """Poll ``/v1/models`` until the model is listed; meanwhile send the chat each time it
    is not, and return the statuses those got (none before the router answers)."""
    deadline = time.monotonic() + timeout_s
    statuses: list[int] = []
    while time.monotonic() < deadline and launcher.poll() is None:
        try:
            models = httpx.get(url + "/v1/models", timeout=5).json()["data"]
        except httpx.TransportError:
            models = None  # the router is not up yet
        if models is not None:
            if tiny_llama.SERVED_NAME in {m["id"] for m in models}:
                return statuses
            statuses.append(generate(url, "/v1/chat/completions", CHAT).status)
        time.sleep(0.5)
    raise AssertionError(f"model never listed; requests meanwhile got {statuses}")


def _assert_engines_run_the_chosen_dtype(output: str, run_dir) -> None:
    """The launcher's one dtype line names what this CPU computes natively, and each
    engine's own config line (vLLM logs ``dtype=torch.X`` at start) shows it runs that."""
    expected = choose_dtype(device="cpu", cpu=read_cpu())
    assert f"pdserve: {expected.line()}" in output, output[-3000:]
    for role in ("prefill", "decode"):
        log = (run_dir / f"{role}-0.engine.log").read_text(errors="replace")
        assert f"dtype=torch.{expected.dtype}," in log, f"{role}: {expected.dtype} not in its log"


def _engine_url(run_dir, role: str) -> str:
    workers = json.loads((run_dir / "cluster.json").read_text())["workers"]
    return next(f"http://127.0.0.1:{w['engine_port']}" for w in workers if w["role"] == role)


def _read_until(process: subprocess.Popen, marker: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    lines = []
    for line in process.stdout:
        lines.append(line)
        if marker in line or time.monotonic() > deadline:
            break
    return "".join(lines)


def _log_tails(run_dir, lines: int = 25) -> str:
    """The end of every process's log: what CI shows when a worker never got ready."""
    parts = []
    for log in sorted(run_dir.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"\n--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "".join(parts)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
