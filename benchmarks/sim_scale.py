"""How many sims one process holds: start N in one ``pdserve sim`` process, send each
a request, and record start-up time and resident memory.

    python -m benchmarks.sim_scale [--count 200] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil

from contracts.machine import machine_record
from modelstore import tiny_llama


async def _all_answer(base_port: int, count: int, timeout_s: float) -> float:
    """Seconds until every sim answered /health and one completion."""
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:

        async def one(port: int) -> None:
            url = f"http://127.0.0.1:{port}"
            while True:
                try:
                    async with session.get(url + "/health") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"sim on port {port} never answered")
                await asyncio.sleep(0.2)
            body = {"model": "m", "prompt": "hello", "max_tokens": 4}
            async with session.post(url + "/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()

        await asyncio.gather(*(one(base_port + i) for i in range(count)))
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--port", type=int, default=21000,
                        help="first port; keep the range below the ephemeral ports")  # fmt: skip
    args = parser.parse_args(argv)
    base_port = args.port
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "sim", "--model", str(tiny_llama.ensure()),
         "--served-model-name", "m", "--port", str(base_port), "--count", str(args.count)],
    )  # fmt: skip
    try:
        ready_s = asyncio.run(_all_answer(base_port, args.count, timeout_s=300))
        rss_mib = psutil.Process(process.pid).memory_info().rss / 2**20
    finally:
        process.terminate()
        process.wait(timeout=30)
    result = {
        "machine": machine_record(),
        "command": "python -m benchmarks.sim_scale " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "sims": args.count,
        "ready_and_answered_s": round(ready_s, 2),
        "process_rss_mib": round(rss_mib, 1),
        "rss_per_sim_mib": round(rss_mib / args.count, 2),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_scale.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
