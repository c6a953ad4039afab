"""NIXL's progress-thread poll timeout: idle CPU and read latency, two real processes.

For each timeout, a target process registers 16 MiB with a NIXL agent built the way
vLLM builds it, and an initiator reads it 20 times over UCX on loopback. Each
process reports its CPU use while idle. The timeout reaches NIXL through the
engines' own start-up file (agent/engine_site), so this measures what the agents
ship. 0 is nixl 1.5.1's hard-coded default (a busy poll).

    python -m benchmarks.nixl_progress_delay [--delays-us 0 1000 10000 100000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from contracts.machine import machine_record

ENGINE_SITE = Path(__file__).resolve().parents[1] / "agent" / "engine_site"
BUFFER_BYTES = 16 << 20
READS = 20


def idle_cpu_percent(seconds: float = 2.0) -> float:
    start_cpu, start = time.process_time(), time.monotonic()
    time.sleep(seconds)
    return 100 * (time.process_time() - start_cpu) / (time.monotonic() - start)


def new_agent(name: str):  # type: ignore[no-untyped-def]
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(num_threads=4, capture_telemetry=True))


def target(to_parent: multiprocessing.Queue, done: multiprocessing.Queue) -> None:
    import torch

    agent = new_agent("target")
    buffer = torch.ones(BUFFER_BYTES, dtype=torch.uint8)
    agent.register_memory(buffer)
    descs = agent.get_serialized_descs(agent.get_xfer_descs(buffer))
    to_parent.put((agent.get_agent_metadata(), descs))
    to_parent.put(idle_cpu_percent())
    done.get()


def measure_here() -> dict:
    """Run in a child interpreter that has the engine start-up file on its path."""
    import torch

    from_target, done = multiprocessing.Queue(), multiprocessing.Queue()
    peer = multiprocessing.Process(target=target, args=(from_target, done))
    peer.start()
    metadata, descs = from_target.get()
    agent = new_agent("initiator")
    buffer = torch.zeros(BUFFER_BYTES, dtype=torch.uint8)
    agent.register_memory(buffer)
    remote_name = agent.add_remote_agent(metadata)
    remote, local = agent.deserialize_descs(descs), agent.get_xfer_descs(buffer)
    initiator_idle = idle_cpu_percent()
    target_idle = from_target.get()
    reads_ms = []
    for _ in range(READS):
        started = time.perf_counter()
        handle = agent.initialize_xfer("READ", local, remote, remote_name)
        agent.transfer(handle)
        while (state := agent.check_xfer_state(handle)) == "PROC":
            pass
        if state != "DONE":
            raise RuntimeError(f"NIXL read ended {state}")
        reads_ms.append((time.perf_counter() - started) * 1000)
        agent.release_xfer_handle(handle)
        time.sleep(0.05)
    if int(buffer.min()) != 1:
        raise RuntimeError("the read did not bring the target's bytes")
    done.put(True)
    peer.join()
    return {
        "idle_cpu_pct_target": round(target_idle, 1),
        "idle_cpu_pct_initiator": round(initiator_idle, 1),
        "read_ms_p50": round(statistics.median(reads_ms), 2),
        "read_ms_max": round(max(reads_ms), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delays-us", type=int, nargs="+", default=[0, 1000, 10000, 100000])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_here()))
        return 0
    rows = []
    for delay_us in args.delays_us:
        env = dict(os.environ, PYTHONPATH=str(ENGINE_SITE), UCX_NET_DEVICES="lo")
        env.pop("PDSERVE_NIXL_PROGRESS_DELAY_US", None)
        if delay_us:
            env["PDSERVE_NIXL_PROGRESS_DELAY_US"] = str(delay_us)
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.nixl_progress_delay", "--child"],
            env=env, capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        row = {"progress_delay_us": delay_us, **json.loads(done.stdout.splitlines()[-1])}
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nixl_progress_delay.json").write_text(json.dumps({
        "machine": machine_record(),
        "command": ("python -m benchmarks.nixl_progress_delay " + " ".join(argv or sys.argv[1:]))
        .strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "buffer_bytes": BUFFER_BYTES, "reads": READS, "rows": rows,
    }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
