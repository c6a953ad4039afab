"""``pdserve up`` on sims, stopped each way a person, a harness or a crash stops it: no
process of the cluster is left, and none of its ports still listens.

- SIGTERM: the orderly stop (agents drain and stop their engines, then the router).
- SIGTERM to the launcher's group, SIGKILL to it 1 s later (a harness, systemd's stop
  timeout, a Kubernetes grace period): the launcher dies mid-stop.
- SIGKILL of the launcher alone: no stop at all; its children die with it.
- SIGINT twice: a person pressing Ctrl-C again; the second means stop now.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from localrun.ports import free_ports
from tests import processes
from tests.clusters import MODEL
from tests.conditions import wait_for

READY = "pdserve: ready:"
START_TIMEOUT_S = 60.0
# Everything gone within this long of the stop (the orderly stop of idle sims takes ~2 s).
GONE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Launched:
    launcher: subprocess.Popen
    output: Path
    router_url: str
    family: list[processes.Process]  # the launcher's descendants: router, agents, engines
    ports: set[int]  # every port the cluster was given


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Launched]:
    """A ready ``pdserve up --engine sim`` (1 prefill + 1 decode), in a session of its own
    as a harness starts it; whatever the test leaves of it is killed at the end."""
    (port,) = free_ports(1)
    run_dir, output = tmp_path / "run", tmp_path / "launcher.out"
    with output.open("wb") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", "--engine", "sim", "--model", "tiny",
             "--prefill", "1", "--decode", "1", "--port", str(port), "--run-dir", str(run_dir)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    family: list[processes.Process] = []
    try:
        try:
            wait_for(lambda: _said(output, READY), START_TIMEOUT_S, "pdserve up to be ready")
        except AssertionError as error:
            raise AssertionError(f"{error}:\n{_said_so_far(output, run_dir)}") from None
        now = processes.snapshot()
        family = [now[pid] for pid in processes.descendants(launcher.pid, now)]
        cluster = json.loads((run_dir / "cluster.json").read_text())
        ports = {port} | {
            w[name] for w in cluster["workers"]
            for name in ("engine_port", "side_channel_port", "kv_events_port")
        }  # fmt: skip
        yield Launched(launcher, output, cluster["router_url"], family, ports)
    finally:
        for process in [p for p in family if processes.alive(p)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()


def _orderly(launched: Launched) -> None:
    os.killpg(launched.launcher.pid, signal.SIGTERM)
    assert launched.launcher.wait(timeout=GONE_TIMEOUT_S) == 0


def _sigterm_then_sigkill_after_1s(launched: Launched) -> None:
    os.killpg(launched.launcher.pid, signal.SIGTERM)
    try:
        launched.launcher.wait(timeout=1)  # the harness's grace: 1 s
    except subprocess.TimeoutExpired:
        os.killpg(launched.launcher.pid, signal.SIGKILL)
    launched.launcher.wait(timeout=5)


def _sigkill_launcher_alone(launched: Launched) -> None:
    launched.launcher.kill()
    assert launched.launcher.wait(timeout=5) == -signal.SIGKILL


def _sigint_twice(launched: Launched) -> None:
    # A long answer streaming: the orderly stop would drain it (~20 s on the sim).
    stream = _Stream(launched.router_url)
    assert stream.started.wait(timeout=20), "the stream never started"
    launched.launcher.send_signal(signal.SIGINT)
    wait_for(lambda: _said(launched.output, "pdserve: stopping"), 10, "the stop to begin")
    launched.launcher.send_signal(signal.SIGINT)
    launched.launcher.wait(timeout=10)  # stop now: no drain, no grace periods
    assert _said(launched.output, "second signal: killing every process now")
    stream.thread.join(timeout=10)
    assert not stream.done, "stop now must cut the stream, not drain it"


# Each way starts a cluster of its own: the fast tier stops it the orderly way and by
# killing the launcher alone (the parent-death path); the two escalations are slow-tier.
@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(_orderly, id="sigterm"),
        pytest.param(_sigkill_launcher_alone, id="sigkill-launcher-alone"),
        pytest.param(
            _sigterm_then_sigkill_after_1s,
            id="sigterm-then-sigkill-after-1s",
            marks=pytest.mark.slow,
        ),
        pytest.param(_sigint_twice, id="sigint-twice", marks=pytest.mark.slow),
    ],
)
def test_no_process_or_port_is_left_however_pdserve_up_stops(
    launched: Launched, stop: Callable[[Launched], None]
):
    commands = [p.command() for p in launched.family]
    assert sum("cli.main router" in c for c in commands) == 1, commands
    assert sum(" prefill " in c or " decode " in c for c in commands) == 2, commands
    assert len(launched.family) >= 5, commands  # and two engines under the agents
    listening = processes.listening_ports(launched.ports)
    assert len(listening) >= 3, "the router's and both engines' ports must listen first"

    stop(launched)

    def gone() -> bool:
        alive = [p for p in launched.family if processes.alive(p)]
        return not alive and not processes.listening_ports(launched.ports)

    try:
        wait_for(gone, GONE_TIMEOUT_S, "every process and port of the cluster to go")
    except AssertionError as error:
        alive = [p for p in launched.family if processes.alive(p)]
        still = processes.listening_ports(launched.ports)
        pytest.fail(f"{error}; alive:\n{processes.describe(alive)}\nlistening: {still}")


class _Stream:
    """A streamed completion of ~3500 tokens, read on a thread of its own."""

    def __init__(self, router_url: str) -> None:
        self.started = threading.Event()
        self.done = False
        self.thread = threading.Thread(target=self._read, args=(router_url,), daemon=True)
        self.thread.start()

    def _read(self, router_url: str) -> None:
        body = {"model": MODEL, "prompt": "count", "max_tokens": 3500, "stream": True}
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream("POST", router_url + "/v1/completions", json=body, timeout=60) as response,
        ):
            for line in response.iter_lines():
                self.started.set()
                self.done = self.done or line == "data: [DONE]"


def _said(output: Path, text: str) -> bool:
    return text in output.read_text(errors="replace")


def _said_so_far(output: Path, run_dir: Path) -> str:
    logs = [f"--- {log.name}\n" + log.read_text(errors="replace")[-2000:]
            for log in sorted(run_dir.glob("*.log"))]  # fmt: skip
    return output.read_text(errors="replace") + "\n".join(logs)
