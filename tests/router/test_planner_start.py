"""``pdserve planner`` started before the routers (a pod beside theirs) waits for them,
then plans: it neither crashes nor spins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from localrun.ports import free_ports
from tests.conditions import wait_for

PROFILE = Path(__file__).resolve().parents[2] / "sim/profiles/tiny-cpu.json"


def test_a_planner_started_first_waits_for_the_router_then_reads_it(tmp_path: Path) -> None:
    port, metrics_port = free_ports(2)
    log = tmp_path / "planner.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDSERVE_")}
    planner = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "planner", "--router", f"http://127.0.0.1:{port}",
         "--model", "m", "--slo", "ttft=1,itl=0.1", "--profile", str(PROFILE),
         "--interval-s", "0.3", "--metrics-port", str(metrics_port)],
        env={**env, "PDSERVE_PLANNER_TOKEN": "tok-planner"},
        stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    router = None
    try:
        wait_for(lambda: log.read_text().count("no router answers /metrics yet") >= 2, 30,
                 "the planner to retry the absent router")  # fmt: skip
        assert planner.poll() is None
        router = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "router", "--port", str(port)],
            env={**env, "PDSERVE_ADMIN_TOKENS": "planner:planner:tok-planner"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        # Past its first scrape it asks for the pools: no worker serves m yet.
        wait_for(lambda: "no workers serve m yet" in log.read_text(), 60, "a planning pass")
        assert planner.poll() is None
    finally:
        for process in (planner, router):
            if process is not None:
                process.terminate()
                process.wait(timeout=10)


def test_a_planner_no_router_answers_gives_up_after_its_start_timeout(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDSERVE_")}
    finished = subprocess.run(
        [sys.executable, "-m", "cli.main", "planner", "--router", f"http://127.0.0.1:{port}",
         "--model", "m", "--slo", "ttft=1,itl=0.1", "--profile", str(PROFILE),
         "--interval-s", "0.3", "--start-timeout-s", "1"],
        env={**env, "PDSERVE_PLANNER_TOKEN": "tok-planner"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert finished.returncode == 1
    assert "no router answers /metrics yet" in finished.stderr  # it did try, more than once
    assert "no router answered /metrics within 1 s" in finished.stderr
