"""Router and disaggregation overhead, measured side by side in one run.

Five ways to serve the same streamed completion (the tiny model unless ``--model``):
  (a) direct      the colocated vLLM (no NIXL), called directly;
  (a') direct_pd  the decode vLLM (NixlConnector loaded), called directly with no
                  handoff: what the transfer machinery costs every request;
  (b) router      the colocated engine through the router (no P/D);
  (c) router_pd   the disaggregated path through the router;
  (d) raw_pd      the two-call P/D protocol, called directly on the engines.

The modes are interleaved request by request, so machine noise hits all of them
alike; every request carries a fresh prompt prefix, so no mode gets a prefix-cache
hit from another. Reported: TTFT and end-to-end latency (p50/p90/mean), the
differences the budgets are about ((b-a) router cost, (c-d) router cost on the P/D
path, (d-a) the P/D tax, a'/a the NIXL engine's own cost), each engine's CPU use
while the cluster idles, and whether each goal of issue 11 was met. The router runs
with the settings it ships with (the KV lease guard on).

    python -m benchmarks.pd_overhead [--requests 30] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import psutil

from contracts.machine import machine_record
from kvtransfer.handoff import PREFILL_REQUEST_PARAMS
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore.known import resolve

MODES = ("direct", "direct_pd", "router", "router_pd", "raw_pd")
PROMPT_WORDS = {"short": 50, "long": 400}
MAX_TOKENS = 16
REQUEST_TIMEOUT_S = 90


@dataclass(frozen=True, slots=True)
class Sample:
    mode: str
    prompt: str
    ttft_ms: float
    e2e_ms: float
    error: str | None = None  # failed requests count, they are not timed


def make_prompt(nonce: str, words: int) -> str:
    vocabulary = ("cache", "block", "token", "prefill", "decode", "router", "queue", "lease")
    return f"request {nonce}: " + " ".join(vocabulary[i % len(vocabulary)] for i in range(words))


async def stream_timing(
    session: aiohttp.ClientSession, url: str, body: dict
) -> tuple[float, float]:
    """(seconds to the first data event, seconds to [DONE]) of one streamed call."""
    started = time.perf_counter()
    first = None
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}: {await response.text()}")
        async for line in response.content:
            if first is None and line.startswith(b"data: "):
                first = time.perf_counter() - started
            if line.startswith(b"data: [DONE]"):
                break
    return first if first is not None else float("nan"), time.perf_counter() - started


async def raw_two_call(
    session: aiohttp.ClientSession, prefill_url: str, decode_url: str, body: dict
) -> tuple[float, float]:
    """The P/D protocol with no router: prefill with max_tokens=1, then decode the handoff."""
    started = time.perf_counter()
    prefill = {**body, "stream": False, "max_tokens": 1,
               "kv_transfer_params": PREFILL_REQUEST_PARAMS}  # fmt: skip
    async with session.post(prefill_url + "/v1/completions", json=prefill) as response:
        handoff = (await response.json())["kv_transfer_params"]
    offset = time.perf_counter() - started
    ttft, e2e = await stream_timing(
        session, decode_url + "/v1/completions", {**body, "kv_transfer_params": handoff}
    )
    return offset + ttft, offset + e2e


async def measure(cluster: LocalCluster, requests: int, warmup: int) -> list[Sample]:
    colocated = cluster.worker("colocated-0").engine_url
    served, colocated_name = cluster.plan.served_name, cluster.plan.colocated_served_name
    prefill = cluster.worker("prefill-0").engine_url
    decode = cluster.worker("decode-0").engine_url
    # mode -> (URL, served model) for the single-call modes
    single_call = {
        "direct": (colocated + "/v1/completions", colocated_name),
        "direct_pd": (decode + "/v1/completions", served),
        "router": (cluster.router_url + "/v1/completions", colocated_name),
        "router_pd": (cluster.router_url + "/v1/completions", served),
    }
    samples: list[Sample] = []
    rounds = warmup + requests
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=16)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await warm_up(session, cluster.router_url, (colocated_name, served))
        for size, words in PROMPT_WORDS.items():
            for index in range(rounds):
                for mode in MODES:
                    body = {
                        "prompt": make_prompt(f"{size}-{index}-{mode}", words),
                        "max_tokens": MAX_TOKENS,
                        "temperature": 0,
                        "ignore_eos": True,
                        "stream": True,
                    }
                    try:
                        if mode == "raw_pd":
                            body["model"] = served
                            ttft_s, e2e_s = await raw_two_call(session, prefill, decode, body)
                        else:
                            url, body["model"] = single_call[mode]
                            ttft_s, e2e_s = await stream_timing(session, url, body)
                        sample = Sample(mode, size, ttft_s * 1000, e2e_s * 1000)
                    except (RuntimeError, KeyError, aiohttp.ClientError, TimeoutError) as error:
                        sample = Sample(mode, size, math.nan, math.nan, error=str(error)[:300])
                    if index >= warmup:
                        samples.append(sample)
                if (index + 1) % 5 == 0 or index + 1 == rounds:
                    print(f"bench: {size} prompts, {index + 1}/{rounds} rounds", flush=True)
    return samples


async def warm_up(session: aiohttp.ClientSession, router_url: str, models: tuple) -> None:
    """One request per path, not measured: the first P/D request pays the NIXL handshake.
    No retry: a first request that fails is a failure users would see, and stops the run."""
    for model in models:
        body = {"model": model, "prompt": "warm up", "max_tokens": 2, "stream": True}
        await stream_timing(session, router_url + "/v1/completions", body)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarise(samples: list[Sample]) -> dict:
    summary: dict = {}
    for size in PROMPT_WORDS:
        summary[size] = {}
        for mode in MODES:
            tried = [s for s in samples if s.prompt == size and s.mode == mode]
            chosen = [s for s in tried if s.error is None] or [
                Sample(mode, size, math.nan, math.nan)
            ]
            summary[size][mode] = {
                "failed": sum(1 for s in tried if s.error is not None),
            } | {
                metric: {
                    "p50": percentile([getattr(s, metric) for s in chosen], 0.5),
                    "p90": percentile([getattr(s, metric) for s in chosen], 0.9),
                    "max": max(getattr(s, metric) for s in chosen),
                    "mean": statistics.fmean(getattr(s, metric) for s in chosen),
                }
                for metric in ("ttft_ms", "e2e_ms")
            }
        p50 = {mode: summary[size][mode]["ttft_ms"]["p50"] for mode in MODES}
        summary[size]["deltas_p50_ms"] = {
            "router_added_b_minus_a": p50["router"] - p50["direct"],
            "router_on_pd_c_minus_d": p50["router_pd"] - p50["raw_pd"],
            "pd_tax_d_minus_a": p50["raw_pd"] - p50["direct"],
            "disaggregation_c_minus_b": p50["router_pd"] - p50["router"],
        }
        summary[size]["nixl_engine_ttft_ratio"] = p50["direct_pd"] / p50["direct"]
    return summary


def goals(summary: dict, idle: dict, lease_reprefills: float, kv_lease_s: float) -> list[dict]:
    """Issue 11's goals: each a measured value, its upper limit, and whether it was met."""
    rows = []

    def goal(name: str, value: float, limit: float) -> None:
        rows.append({"goal": name, "value": round(value, 3), "limit": limit, "met": value <= limit})

    for size in PROMPT_WORDS:
        d, ttft = summary[size]["deltas_p50_ms"], summary[size]
        goal(f"{size}: router added TTFT p50 (b-a), ms", d["router_added_b_minus_a"], 1)
        goal(f"{size}: router P/D minus raw two-call TTFT p50 (c-d), ms",
             d["router_on_pd_c_minus_d"], 5)  # fmt: skip
        goal(f"{size}: NIXL engine direct / plain engine, TTFT p50", ttft["nixl_engine_ttft_ratio"],
             1.25)  # fmt: skip
        worst = max(ttft[m]["ttft_ms"]["p90"] / ttft[m]["ttft_ms"]["p50"] for m in MODES)
        goal(f"{size}: worst TTFT p90/p50 over the modes", worst, 3)
    goal("short: P/D tax (d-a) TTFT p50, ms", summary["short"]["deltas_p50_ms"]["pd_tax_d_minus_a"],
         50)  # fmt: skip
    goal("failed requests", sum(summary[s][m]["failed"] for s in PROMPT_WORDS for m in MODES), 0)
    goal("KV lease re-prefills on the router", lease_reprefills, 0)
    slowest_s = max(summary[s]["router_pd"]["ttft_ms"]["max"] for s in PROMPT_WORDS) / 1000
    goal("slowest P/D TTFT against the KV lease, s", slowest_s, kv_lease_s)
    for worker, percent in idle.items():
        goal(f"{worker}: engine CPU while idle, % of a core", percent, 10)
    return rows


def idle_engine_cpu(cluster: LocalCluster, seconds: float = 5.0) -> dict[str, float]:
    """Percent of one core each worker's engine (every process under its agent) uses idle."""

    def cpu_s(root: psutil.Process) -> float:
        total = 0.0
        for process in root.children(recursive=True):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    agents = {name: psutil.Process(process.pid) for name, process in cluster.agents.items()}
    before = {name: cpu_s(agent) for name, agent in agents.items()}
    time.sleep(seconds)
    return {name: 100 * (cpu_s(agent) - before[name]) / seconds for name, agent in agents.items()}


def router_counter(router_url: str, name: str) -> float:
    """The sum of a counter's samples on the router's /metrics."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))  # fmt: skip


def table(saved: dict) -> str:
    summary, requests = saved["summary"], saved["requests_per_mode"]
    lines = [
        f"# P/D overhead ({saved.get('model', 'tiny-llama')}, CPU)", "",
        f"Command: `{saved['command']}` ({saved['date']})", "",
        f"{requests} streamed completions per mode and prompt size, {MAX_TOKENS} output tokens, "
        "modes interleaved. Milliseconds.", "",
        "| prompt | mode | TTFT p50 | TTFT p90 | E2E p50 | E2E p90 | failed |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for size in PROMPT_WORDS:
        for mode in MODES:
            ttft, e2e = summary[size][mode]["ttft_ms"], summary[size][mode]["e2e_ms"]
            lines.append(f"| {size} ({PROMPT_WORDS[size]} words) | {mode} | {ttft['p50']:.1f} | "
                         f"{ttft['p90']:.1f} | {e2e['p50']:.1f} | {e2e['p90']:.1f} | "
                         f"{summary[size][mode]['failed']} |")  # fmt: skip
    lines += ["", "| prompt | router added (b-a) | router on P/D (c-d) | P/D tax (d-a) | "
              "disaggregation (c-b) |", "|---|---|---|---|---|"]  # fmt: skip
    for size in PROMPT_WORDS:
        d = summary[size]["deltas_p50_ms"]
        cells = " | ".join(f"{value:+.1f}" for value in d.values())
        lines.append(f"| {size} | {cells} |")
    lines += ["", "Engine CPU while the cluster idles (percent of one core, every process "
              "of the engine):", "", "| worker | idle CPU % |", "|---|---|"]  # fmt: skip
    lines += [f"| {worker} | {percent:.1f} |" for worker, percent in saved["idle_cpu_pct"].items()]
    lines += ["", "| goal | measured | limit | met |", "|---|---|---|---|"]
    lines += [f"| {g['goal']} | {g['value']} | {g['limit']} | {'yes' if g['met'] else 'NO'} |"
              for g in saved["goals"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(PROMPT_WORDS), figsize=(11, 4), sharey=False)
    for axis, size in zip(axes, PROMPT_WORDS, strict=True):
        data = [[s.ttft_ms for s in samples if s.prompt == size and s.mode == m and not s.error]
                for m in MODES]  # fmt: skip
        axis.boxplot(data, tick_labels=MODES, showfliers=True)
        axis.set_title(f"TTFT, {size} prompt ({PROMPT_WORDS[size]} words)")
        axis.set_ylabel("ms (log scale)")
        axis.set_yscale("log")
        axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_reports(out: Path, saved: dict) -> None:
    report = table(saved)
    (out / "pd_overhead.md").write_text(report)
    plot([Sample(**s) for s in saved["samples"]], out / "pd_overhead.png")
    print(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=30, help="measured requests per mode")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild the table and plot from OUT/pd_overhead.json")  # fmt: skip
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        write_reports(out, json.loads((out / "pd_overhead.json").read_text()))
        return 0
    model_path, served = resolve(args.model)
    (port,) = free_ports(1)
    run_dir = Path(tempfile.mkdtemp(prefix="pdserve-bench-"))
    plan = ClusterPlan(
        model_path=model_path, served_name=served, colocated_served_name=f"{served}-colocated",
        prefill=1, decode=1, colocated=1,
        port=port, run_dir=run_dir, drain_timeout_s=5,
    )  # fmt: skip
    cluster = LocalCluster(plan, say=lambda m: print(f"bench: {m}", flush=True))
    try:
        cluster.start()
        idle = idle_engine_cpu(cluster)
        print(f"bench: idle engine CPU %: {idle}", flush=True)
        samples = asyncio.run(measure(cluster, args.requests, args.warmup))
        reprefills = router_counter(cluster.router_url, "pdserve_kv_lease_reprefills_total")
    finally:
        cluster.stop()
    summary = summarise(samples)
    saved = {
        "machine": machine_record(),
        "command": ("python -m benchmarks.pd_overhead " + " ".join(argv or sys.argv[1:])).strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": served, "requests_per_mode": args.requests, "max_tokens": MAX_TOKENS,
        "idle_cpu_pct": idle, "kv_lease_reprefills": reprefills,
        "goals": goals(summary, idle, reprefills, plan.kv_lease_s),
        "summary": summary, "samples": [asdict(s) for s in samples],
    }  # fmt: skip
    (out / "pd_overhead.json").write_text(json.dumps(saved, indent=2))
    write_reports(out, saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
