"""Two router replicas in front of one pool: does the load stay even when each replica
counts only its own in-flight requests?

Each replica adds its own in-flight count to what the engines report in heartbeats
(running and waiting requests, every ``--heartbeat-s``); it does not see the other
replica's requests as they are sent. This measures what that costs: the same Poisson
traffic sent through one replica, then split across two (alternate requests), rounds
interleaved; while it runs, every decode engine's own ``vllm:num_requests_running`` is
sampled every 0.2 s. Imbalance per sample = the busiest decode engine's running requests
over the pool's mean (1.0 = even; samples with nothing running are left out and counted).
Then convergence: a drain and an undrain made through replica A, ten times each, timed
until replica B's pools view shows them (B polled back to back).

    python -m benchmarks.replica_load [--rate 6] [--duration-s 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from agent import process_group
from benchmarks.ratio_change import schedule
from contracts.machine import machine_record
from loadgen.metrics import percentiles
from loadgen.replay import replay
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from localrun.redis_server import RedisServer
from modelstore import tiny_llama


async def running(session: aiohttp.ClientSession, engine_url: str) -> float:
    async with session.get(engine_url + "/metrics") as response:
        text = await response.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:num_requests_running"
    )


async def sample_imbalance(engines: list[str], stop: asyncio.Event) -> tuple[list[float], int]:
    ratios: list[float] = []
    idle = 0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            counts = await asyncio.gather(*(running(session, u) for u in engines))
            mean = sum(counts) / len(counts)
            if mean > 0:
                ratios.append(max(counts) / mean)
            else:
                idle += 1
            await asyncio.sleep(0.2)
    return ratios, idle


async def one_round(urls: list[str], engines: list[str], args: argparse.Namespace) -> dict:
    plan = schedule(args.rate, args.duration_s, args.max_tokens, seed=args.seed)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_imbalance(engines, stop))
    shares = [plan[i :: len(urls)] for i in range(len(urls))]
    runs = [replay(url + "/v1/completions", share, deadline_s=args.duration_s + 120)
            for url, share in zip(urls, shares, strict=True)]  # fmt: skip
    results = [r for share in await asyncio.gather(*runs) for r in share]
    stop.set()
    ratios, idle = await sampler
    return {
        "replicas": len(urls),
        "requests": len(results),
        "failed": sum(1 for r in results if not r.ok),
        "ttft_ms": percentiles([r.ttft_s for r in results if r.ok and r.ttft_s]),
        "imbalance_mean": statistics.fmean(ratios) if ratios else None,
        "imbalance_p95": sorted(ratios)[int(0.95 * (len(ratios) - 1))] if ratios else None,
        "samples": len(ratios),
        "idle_samples_left_out": idle,
    }


async def convergence(url_a: str, url_b: str, token: str, worker: str, times: int) -> dict:
    """Seconds from a drain (and an undrain) answered by A until B shows it, by polling B."""
    headers = {"Authorization": f"Bearer {token}"}
    seen: list[float] = []
    async with aiohttp.ClientSession(headers=headers) as session:

        async def state_on_b() -> str:
            async with session.get(url_b + "/admin/v1/pools") as response:
                pools = (await response.json())["models"][tiny_llama.SERVED_NAME]["workers"]
            return next(w["state"] for w in pools if w["worker_id"] == worker)

        for index in range(2 * times):
            action, want = ("drain", "draining") if index % 2 == 0 else ("undrain", "ready")
            async with session.post(f"{url_a}/admin/v1/workers/{worker}/{action}") as answer:
                assert answer.status == 200, await answer.text()
            done_s = time.perf_counter()
            while await state_on_b() != want:
                if time.perf_counter() - done_s > 10:
                    raise RuntimeError(f"B never showed {worker} {want}")
            seen.append(time.perf_counter() - done_s)
    return {"changes": len(seen), "ms": percentiles(seen), "max_ms": 1000 * max(seen)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--heartbeat-s", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="pdserve-replica-bench-"))
    redis = RedisServer(run_dir)
    redis.start()
    port_a, port_b = free_ports(2)
    url_b = f"http://127.0.0.1:{port_b}"
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=tiny_llama.SERVED_NAME, prefill=2, decode=4,
        port=port_a, engine="sim", run_dir=run_dir, heartbeat_interval_s=args.heartbeat_s,
        router_env={"PDSERVE_STATE_URL": redis.url}, extra_router_urls=(url_b,),
    )  # fmt: skip
    cluster = LocalCluster(plan, say=lambda line: print("  " + line, flush=True))
    env = {**os.environ, "PDSERVE_STATE_URL": redis.url, **cluster.router_secrets()}
    router_b = process_group.spawn(
        [sys.executable, "-m", "cli.main", "router", "--port", str(port_b)],
        env=env, log_path=run_dir / "router-b.log",
    )  # fmt: skip
    try:
        process_group.wait_until(lambda: process_group.http_ok(url_b + "/health"),
                                 timeout_s=60, what="router B", process=router_b)  # fmt: skip
        cluster.start()
        engines = [w.engine_url for w in cluster.workers if w.role == "decode"]
        rounds = []
        for index in range(args.rounds):
            for urls in ([cluster.router_url], [cluster.router_url, url_b]):
                result = asyncio.run(one_round(urls, engines, args))
                print(f"  round {index + 1}, {len(urls)} replica(s): {result}", flush=True)
                rounds.append(result)
        worker = next(w.name for w in cluster.workers if w.role == "decode")
        converged = asyncio.run(
            convergence(cluster.router_url, url_b, cluster.admin_token, worker, times=10)
        )
        print(f"  drain/undrain on A seen by B: {converged}", flush=True)
    finally:
        cluster.stop()
        process_group.stop([router_b], grace_s=15)
        redis.stop()
    report = {"title": "decode load balance: one router replica vs two",
              "machine": machine_record(),
              "command": "python -m benchmarks.replica_load " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "decode_workers": 4, "rounds": rounds,
              "convergence": converged}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replica_load.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}/replica_load.json (logs: {run_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
