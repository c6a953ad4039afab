"""The engine start-up fixes (agent/engine_site) against the real vLLM and NIXL packages.

Each runs in a fresh interpreter started the way the agent starts an engine, and is
checked both with its switch on and off, so a vLLM or NIXL upgrade that moves the
patched code fails here rather than slowing every P/D engine silently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from agent.engine_spec import ENGINE_SITE_DIR


def run_in_engine_interpreter(code: str, **switches: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDSERVE_")}
    env.update(PYTHONPATH=str(ENGINE_SITE_DIR), VLLM_TARGET_DEVICE="cpu", **switches)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


RESERVED_CORES = (
    "from vllm.platforms.cpu import CpuPlatform\nprint(CpuPlatform.discover_numa_topology())\n"
)


def test_nixl_connector_reserves_no_core_when_the_model_thread_must_stay():
    # Unpatched, vLLM 0.32 finds a core per NUMA node to move the model thread to.
    assert run_in_engine_interpreter(RESERVED_CORES) != "[]"
    assert run_in_engine_interpreter(RESERVED_CORES, PDSERVE_KEEP_MODEL_THREAD_CORES="1") == "[]"


# A NIXL agent created as vLLM creates it, then the CPU its process uses while idle.
IDLE_NIXL_AGENT = """
import json, os, time
os.environ.setdefault("UCX_NET_DEVICES", "lo")
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("idle", nixl_agent_config(num_threads=4, capture_telemetry=True))
time.sleep(0.5)
start_cpu, start = time.process_time(), time.monotonic()
time.sleep(2.0)
print(json.dumps(100 * (time.process_time() - start_cpu) / (time.monotonic() - start)))
"""


def test_nixl_progress_thread_waits_instead_of_busy_polling():
    busy = json.loads(run_in_engine_interpreter(IDLE_NIXL_AGENT))
    waiting = json.loads(
        run_in_engine_interpreter(IDLE_NIXL_AGENT, PDSERVE_NIXL_PROGRESS_DELAY_US="1000")
    )
    # A busy poll takes what the scheduler gives it (a whole idle core); waiting on
    # UCX's event descriptor with a 1 ms timeout measured 2-4% here.
    assert waiting < 25, (busy, waiting)
    assert busy > 2 * waiting, (busy, waiting)


SPIN_SECONDS = """
import tempfile, zmq
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
address = "ipc://" + tempfile.mktemp()
import vllm.distributed.device_communicators.shm_broadcast as queue
spin = SpinCondition(is_reader=True, context=zmq.Context(), notify_address=address).busy_loop_s
print(spin, queue.SHM_READER_RECHECK_INTERVAL_MS)
"""


def test_vllm_workers_sleep_between_steps_instead_of_spinning():
    assert run_in_engine_interpreter(SPIN_SECONDS) == "1 5000"  # vLLM 0.32's own
    spin = run_in_engine_interpreter(SPIN_SECONDS, PDSERVE_ENGINE_IDLE_SPIN_S="0.02")
    assert spin == "0.02 50"
