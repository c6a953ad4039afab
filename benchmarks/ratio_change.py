"""A live P:D ratio change under load: TTFT over time, requests failed, time to converge.

Starts a sim cluster (``--prefill`` + ``--decode`` workers, the tiny-cpu profile), sends
open-loop Poisson traffic at ``--rate`` for ``--duration-s``, and at the times in
``--changes`` (``AT_S:PREFILL:DECODE,...``) asks the router's admin API for a new ratio,
timing each operation until it is done. Writes ``ratio_change.json`` (every request's
send time, TTFT and outcome, each change's timeline) and ``ratio_change.png`` (TTFT over
time with the changes shaded, and the pool counts).

    python -m benchmarks.ratio_change [--rate 4] [--duration-s 90] [--changes 20:3:1,55:2:2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from contracts.machine import machine_record
from loadgen.client import RequestResult
from loadgen.metrics import error_kind, percentiles
from loadgen.replay import Scheduled, replay
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama

OPERATOR_TOKEN = "ratio-bench-operator"


def parse_changes(spec: str) -> list[tuple[float, int, int]]:
    changes = []
    for item in filter(None, spec.split(",")):
        at_s, prefill, decode = item.split(":")
        changes.append((float(at_s), int(prefill), int(decode)))
    return sorted(changes)


def schedule(rate: float, duration_s: float, max_tokens: int, seed: int) -> list[Scheduled]:
    rng = random.Random(seed)
    items, at_s = [], 0.0
    while (at_s := at_s + rng.expovariate(rate)) < duration_s:
        prompt = f"request {len(items)} " + "the quick brown fox " * rng.randint(10, 60)
        body = {"model": tiny_llama.SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens}
        items.append(Scheduled(at_s, body))
    return items


async def run_changes(
    router_url: str, changes: list[tuple[float, int, int]], started: float, until_s: float
) -> tuple[list[dict], list[dict]]:
    """Make each change at its time and follow it to the end; sample the pool counts."""
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    timeline: list[dict] = []
    counts: list[dict] = []
    model = tiny_llama.SERVED_NAME
    async with aiohttp.ClientSession(headers=headers) as session:

        async def sample() -> None:
            async with session.get(f"{router_url}/admin/v1/pools") as response:
                pool = (await response.json())["models"][model]
            counts.append({"at_s": time.perf_counter() - started, **pool["counts"]})

        for at_s, prefill, decode in changes:
            while time.perf_counter() - started < at_s:
                await sample()
                await asyncio.sleep(0.5)
            asked_s = time.perf_counter() - started
            async with session.put(
                f"{router_url}/admin/v1/pools/{model}", json={"prefill": prefill, "decode": decode}
            ) as response:
                accepted = await response.json()
            operation = {"status": "running"}
            while operation["status"] == "running":
                await sample()
                await asyncio.sleep(0.5)
                async with session.get(router_url + accepted["status_url"]) as response:
                    operation = await response.json()
            done_s = time.perf_counter() - started
            timeline.append({
                "asked_at_s": asked_s, "done_at_s": done_s, "converge_s": done_s - asked_s,
                "target": [prefill, decode], "status": operation["status"],
                "steps": operation["steps"],
            })  # fmt: skip
        while time.perf_counter() - started < until_s:
            await sample()
            await asyncio.sleep(0.5)
    return timeline, counts


async def measure(args: argparse.Namespace, cluster: LocalCluster) -> dict:
    plan = schedule(args.rate, args.duration_s, args.max_tokens, args.seed)
    started = time.perf_counter()
    load = replay(cluster.router_url + "/v1/completions", plan,
                  deadline_s=args.duration_s + 120)  # fmt: skip
    changes = run_changes(
        cluster.router_url, parse_changes(args.changes), started, until_s=args.duration_s
    )
    results, (timeline, counts) = await asyncio.gather(load, changes)
    return summarize(results, timeline, counts, args)


def summarize(
    results: list[RequestResult], timeline: list[dict], counts: list[dict], args: argparse.Namespace
) -> dict:
    ok = [r for r in results if r.ok]
    during = [r for r in ok if any(c["asked_at_s"] <= r.started_s <= c["done_at_s"]
                                   for c in timeline)]  # fmt: skip
    outside = [r for r in ok if r not in during]
    return {
        "title": "P:D ratio change under load (sims)",
        "machine": machine_record(),
        "command": "python -m benchmarks.ratio_change " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "requests": len(results),
        "succeeded": len(ok),
        "failed": len(results) - len(ok),
        "errors": dict(Counter(error_kind(r) for r in results if not r.ok)),
        "ttft_ms_during_changes": percentiles([r.ttft_s for r in during if r.ttft_s]),
        "ttft_ms_outside_changes": percentiles([r.ttft_s for r in outside if r.ttft_s]),
        "changes": timeline,
        "pool_counts": counts,
        "requests_timeline": [
            {"at_s": round(r.started_s, 3), "ttft_s": r.ttft_s, "ok": r.ok} for r in results
        ],
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (ttft, pools) = plt.subplots(2, 1, figsize=(10, 6), sharex=True,
                                         height_ratios=[3, 1])  # fmt: skip
    timeline = report["requests_timeline"]
    good = [(r["at_s"], r["ttft_s"]) for r in timeline if r["ok"] and r["ttft_s"]]
    bad = [r["at_s"] for r in timeline if not r["ok"]]
    ttft.scatter(*zip(*good, strict=True), s=6, label="TTFT (request sent at x)")
    if bad:
        ttft.scatter(bad, [0] * len(bad), s=20, color="red", marker="x", label="failed")
    for change in report["changes"]:
        for axis in (ttft, pools):
            axis.axvspan(change["asked_at_s"], change["done_at_s"], color="orange", alpha=0.2)
        ttft.annotate(f"-> {change['target'][0]}P:{change['target'][1]}D "
                      f"({change['converge_s']:.1f}s)", (change["asked_at_s"], 0),
                      xycoords=("data", "axes fraction"), fontsize=8)  # fmt: skip
    ttft.set_ylabel("TTFT (s)")
    ttft.set_title(f"{report['title']}: {report['failed']} of {report['requests']} failed")
    ttft.legend(loc="upper right")
    samples = report["pool_counts"]
    at = [s["at_s"] for s in samples]
    pools.step(at, [s["prefill"] for s in samples], where="post", label="prefill")
    pools.step(at, [s["decode"] for s in samples], where="post", label="decode")
    pools.set_ylabel("workers")
    pools.set_xlabel("seconds into the run")
    pools.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, default=2)
    parser.add_argument("--decode", type=int, default=2)
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--duration-s", type=float, default=90.0)
    parser.add_argument("--changes", default="20:3:1,55:2:2", help="AT_S:PREFILL:DECODE,...")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=tiny_llama.SERVED_NAME,
        prefill=args.prefill, decode=args.decode, port=port, engine="sim",
        run_dir=Path(tempfile.mkdtemp(prefix="pdserve-ratio-bench-")), ready_timeout_s=120,
        heartbeat_interval_s=0.5, drain_timeout_s=30,
        router_env={"PDSERVE_ADMIN_TOKENS": f"bench:operator:{OPERATOR_TOKEN}"},
    )  # fmt: skip
    cluster = LocalCluster(plan, say=lambda line: print("  " + line, flush=True))
    try:
        cluster.start()
        report = asyncio.run(measure(args, cluster))
    finally:
        cluster.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ratio_change.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "ratio_change.png")
    for change in report["changes"]:
        print(f"-> {change['target']}: {change['status']} in {change['converge_s']:.1f}s")
    print(f"{report['failed']} of {report['requests']} requests failed; "
          f"wrote {args.out}/ratio_change.json and .png (logs: {plan.run_dir})")  # fmt: skip
    return 0 if report["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
