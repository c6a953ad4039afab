"""Routing policies compared on a real trace: round_robin, least_loaded, prefix_affinity.

Replays the Mooncake conversation trace (shared/traces) open-loop against a fresh
sim cluster per policy: PREFILL prefill + DECODE decode sims with the H100 profile,
the real router and agents. Scaling, as the trace README describes: lengths and the
trace's 512-token block divided by ``--length-scale``, timestamps divided by ``--speed``; output
lengths divided by ``--output-scale`` (decode is not what is compared, and every
token is a relayed SSE event on this 2-core box).

Time dilation: 8 H100s prefill ~100 short prompts a second, more than one 2-core
box can push through a Python router, 16 sims and the load generator. So the sims
run the H100 profile ``--time-dilation`` times slower (every step, overhead and
transfer time multiplied), and the trace is replayed at a rate that loads those
slower GPUs the way the real rate would load real ones. Ratios between policies
hold; absolute TTFTs are in dilated time (divide the engine part by the factor).

Reported per policy:
- prefix hit rate: prompt tokens the prefill engines found cached (their own
  vllm:prefix_cache_hits / queries), against the infinite-cache oracle computed
  on the same token ids (every leading block any earlier request computed);
- TTFT p50 / p90 / p99 of the requests that succeeded, and errors;
- hotspot factor: prefill workers x the largest share of prefill requests;
- goodput: requests per second meeting the TTFT SLO, and the fraction that did.

    python -m benchmarks.routing_policies [--requests 3000] [--speed 3.85] [--length-scale 4]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from contracts.machine import machine_record
from contracts.tokenization import load_tokenizer
from loadgen.client import RequestResult
from loadgen.metrics import error_kind, percentiles
from loadgen.prometheus_text import scrape, total
from loadgen.replay import Scheduled, replay
from loadgen.traces import (
    DEFAULT_TRACE,
    TRACE_BLOCK_TOKENS,
    BlockText,
    oracle_hit_rate,
    read_trace,
)
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama
from sim.profile import load_profile

POLICIES = ("round_robin", "least_loaded", "prefix_affinity")
PROFILE = "llama3-8b-h100"


def scaled_profile(
    length_scale: float, dilation: float, folder: Path, kv_tokens: int | None = None
) -> Path:
    """The H100 profile with every time x dilation (and KV capacity ``kv_tokens`` if given)."""
    base = load_profile(PROFILE)
    slow = {
        name: getattr(base, name) * dilation
        for name in ("request_overhead_ms", "floor_ms", "prefill_ms_per_token",
                     "prefill_ms_per_context", "prefill_ms_per_kpair", "decode_ms_per_seq",
                     "decode_ms_per_kv_ktoken", "transfer_overhead_ms")
    }  # fmt: skip
    scaled = dataclasses.replace(
        base, name=f"{PROFILE}-len{length_scale:g}-x{dilation:g}", **slow,
        kv_capacity_tokens=kv_tokens or base.kv_capacity_tokens,
        prefill_ms_curve=tuple((tokens, ms * dilation) for tokens, ms in base.prefill_ms_curve),
        transfer_gbytes_per_s=base.transfer_gbytes_per_s / dilation,
    )  # fmt: skip
    path = folder / f"{scaled.name}.json"
    path.write_text(json.dumps(dataclasses.asdict(scaled), indent=2))
    return path


def engine_prefix_counters(cluster: LocalCluster, role: str) -> tuple[float, float]:
    hits = queries = 0.0
    for worker in cluster.workers:
        if worker.role == role:
            samples = scrape(worker.engine_url + "/metrics")
            hits += total(samples, "vllm:prefix_cache_hits_total")
            queries += total(samples, "vllm:prefix_cache_queries_total")
    return hits, queries


def run_policy(policy: str, schedule: list[Scheduled], input_tokens: list[int],
               args: argparse.Namespace, profile: Path, work: Path) -> dict:  # fmt: skip
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=tiny_llama.SERVED_NAME,
        prefill=args.prefill, decode=args.decode, port=port, run_dir=work / policy,
        engine="sim", sim_profile=str(profile), max_model_len=200_000,
        ready_timeout_s=300, heartbeat_interval_s=1.0, drain_timeout_s=2,
        router_env={"PDSERVE_ROUTING_POLICY": policy, "PDSERVE_HEARTBEAT_TIMEOUT_S": "30",
                    "PDSERVE_HEALTH_TIMEOUT_S": "10",
                    **dict(item.split("=", 1) for item in args.router_env)},
    )  # fmt: skip
    cluster = LocalCluster(plan, say=lambda line: print(f"  [{policy}] {line}", flush=True))
    try:
        cluster.start()
        hits0, queries0 = engine_prefix_counters(cluster, "prefill")
        router0 = scrape(cluster.router_url + "/metrics")
        progress = {"done": 0}

        def on_result(_: RequestResult) -> None:
            progress["done"] += 1
            if progress["done"] % 250 == 0:
                print(f"  [{policy}] {progress['done']}/{len(schedule)} done", flush=True)

        started = time.perf_counter()
        results = asyncio.run(replay(
            cluster.router_url + "/v1/completions", schedule,
            deadline_s=args.deadline_s, on_result=on_result,
        ))  # fmt: skip
        duration_s = time.perf_counter() - started
        hits1, queries1 = engine_prefix_counters(cluster, "prefill")
        router1 = scrape(cluster.router_url + "/metrics")
    finally:
        cluster.stop()
    ok = [r for r in results if r.ok and r.ttft_s is not None]
    ttft_ms = [r.ttft_s * 1000 for r in ok]
    ttft = percentiles([r.ttft_s for r in ok])
    routed = [
        total(router1, "pdserve_routed_requests_total", worker=w.name)
        - total(router0, "pdserve_routed_requests_total", worker=w.name)
        for w in cluster.workers if w.role == "prefill"
    ]  # fmt: skip
    reason_names = ("prefix_hit", "bounded_load_spill", "load", "cold", *POLICIES)
    reasons = {
        reason: total(router1, "pdserve_routing_decisions_total", pool="prefill", reason=reason)
        - total(router0, "pdserve_routing_decisions_total", pool="prefill", reason=reason)
        for reason in reason_names
    }
    errors = Counter(error_kind(result) for result in results if not result.ok)
    meeting_slo = sum(1 for t in ttft_ms if t <= args.ttft_slo_ms)
    return {
        "policy": policy,
        "requests": len(results),
        "succeeded": len(ok),
        "errors": dict(errors),
        "duration_s": duration_s,
        "prefix_hit_rate": (hits1 - hits0) / max(1.0, queries1 - queries0),
        "predicted_hit_rate_by_worker": {
            w.name: total(router1, "pdserve_prefix_hit_ratio", worker=w.name, source="predicted")
            for w in cluster.workers
            if w.role == "prefill"
        },
        "ttft_p50_ms": ttft["p50"],
        "ttft_p90_ms": ttft["p90"],
        "ttft_p99_ms": ttft["p99"],
        "ttft_mean_ms": ttft["mean"],
        "hotspot_factor": len(routed) * max(routed) / max(1.0, sum(routed)),
        "prefill_requests_per_worker": routed,
        "prefill_decisions_by_reason": {k: v for k, v in reasons.items() if v},
        "goodput_rps": meeting_slo / duration_s,
        "slo_attainment": meeting_slo / max(1, len(results)),
        "ttft_ms_sorted": sorted(ttft_ms),
        # What the tail is made of: the slowest 1% with their prompt lengths and send times.
        "slowest_1pct": slowest(results, input_tokens, schedule, max(1, len(ok) // 100)),
    }


def slowest(
    results: list[RequestResult], input_tokens: list[int], schedule: list[Scheduled], count: int
) -> list[dict]:
    timed = [
        (result, tokens, item)
        for result, tokens, item in zip(results, input_tokens, schedule, strict=True)
        if result.ok and result.ttft_s is not None
    ]
    timed.sort(key=lambda row: -(row[0].ttft_s or 0.0))
    return [
        {"ttft_ms": round((r.ttft_s or 0.0) * 1000), "input_tokens": tokens,
         "sent_at_s": round(item.send_at_s, 1)}
        for r, tokens, item in timed[:count]
    ]  # fmt: skip


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    figure, (cdf, hits, hot) = plt.subplots(1, 3, figsize=(16, 4.5))
    for run in runs:
        values = run["ttft_ms_sorted"]
        if values:
            cdf.plot(values, [(i + 1) / len(values) for i in range(len(values))],
                     label=run["policy"])  # fmt: skip
    cdf.axvline(report["ttft_slo_ms"], color="grey", linestyle=":", label="TTFT SLO")
    cdf.set_xscale("log")
    cdf.set_xlabel("TTFT (ms, log)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("TTFT CDF")
    cdf.legend()
    names = [run["policy"] for run in runs]
    hits.bar(names, [run["prefix_hit_rate"] for run in runs])
    hits.axhline(report["oracle_hit_rate"], color="black", linestyle="--", label="oracle")
    hits.axhline(0.9 * report["oracle_hit_rate"], color="grey", linestyle=":", label="90% oracle")
    hits.set_title("prefix hit rate (tokens)")
    hits.legend()
    hot.bar(names, [run["hotspot_factor"] for run in runs])
    hot.axhline(1.5, color="grey", linestyle=":", label="goal <= 1.5")
    hot.set_title("hotspot factor (prefill)")
    hot.legend()
    figure.suptitle(report["title"])
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--requests", type=int, default=3000, help="the trace's first N")
    parser.add_argument("--speed", type=float, default=3.85, help="timestamps divided by this")
    parser.add_argument("--length-scale", type=float, default=4.0)
    parser.add_argument("--output-scale", type=float, default=32.0)
    parser.add_argument("--time-dilation", type=float, default=10.0,
                        help="sims run the H100 profile this many times slower")  # fmt: skip
    parser.add_argument("--max-input-tokens", type=int, default=16384, help="after scaling")
    parser.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="KV capacity per sim, tokens (default: the H100 profile's)",
    )
    parser.add_argument("--prefill", type=int, default=8)
    parser.add_argument("--decode", type=int, default=8)
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    parser.add_argument("--deadline-s", type=float, default=900.0, help="per policy run")
    parser.add_argument("--router-env", nargs="*", default=[],
                        help="extra router settings, PDSERVE_X=value")  # fmt: skip
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()

    tokenizer = load_tokenizer(str(tiny_llama.ensure()))
    dropped: list[int] = []
    trace = read_trace(args.trace, speed=args.speed, length_scale=args.length_scale,
                       limit=args.requests, max_input_tokens=args.max_input_tokens,
                       on_dropped=dropped.append)  # fmt: skip
    print(f"left out {len(dropped)} requests over {args.max_input_tokens} input tokens "
          "(after scaling); the first N counts the rest", flush=True)  # fmt: skip
    blocks = BlockText(tokenizer, block_tokens=int(TRACE_BLOCK_TOKENS / args.length_scale))
    prompts = [blocks.prompt(request) for request in trace]
    token_ids = [tokenizer.completion_ids(p) for p in prompts]
    assert all(len(ids) == r.input_tokens for ids, r in zip(token_ids, trace, strict=True)), (
        "one word, one token: the prompts must tokenize to their trace lengths"
    )
    block_size = load_profile(PROFILE).block_size_tokens
    oracle = oracle_hit_rate(token_ids, block_size)
    schedule = [
        Scheduled(r.send_at_s, {
            "model": tiny_llama.SERVED_NAME, "prompt": prompt, "temperature": 0,
            "max_tokens": max(1, round(r.output_tokens * args.length_scale / args.output_scale)),
            "ignore_eos": True,
        })
        for r, prompt in zip(trace, prompts, strict=True)
    ]  # fmt: skip
    span_s = trace[-1].send_at_s if trace else 0
    print(f"{len(trace)} requests over {span_s:.0f}s ({len(trace) / max(span_s, 1e-9):.1f} req/s), "
          f"mean prompt {statistics.fmean(r.input_tokens for r in trace):.0f} tokens; "
          f"oracle hit rate {oracle:.1%}", flush=True)  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="pdserve-routing-bench-"))
    profile = scaled_profile(args.length_scale, args.time_dilation, work, args.kv_tokens)
    lengths = [r.input_tokens for r in trace]
    runs = [run_policy(policy, schedule, lengths, args, profile, work) for policy in args.policies]
    report = {
        "title": f"Mooncake trace, first {len(trace)} requests, speed x{args.speed:g}, lengths "
                 f"/{args.length_scale:g}; {args.prefill}P+{args.decode}D sims ({PROFILE}, "
                 f"time x{args.time_dilation:g})",
        "machine": machine_record(),
        "command": "python -m benchmarks.routing_policies " + " ".join(sys.argv[1:]),
        "date": time.strftime("%F %T"),
        "oracle_hit_rate": oracle,
        # Requests over --max-input-tokens are left out of the trace (and of N).
        "max_input_tokens": args.max_input_tokens,
        "dropped_over_max_input_tokens": len(dropped),
        "ttft_slo_ms": args.ttft_slo_ms,
        "offered_rps": len(trace) / max(span_s, 1e-9),
        "sim_profile": json.loads(profile.read_text()),
        "runs": runs,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    plot(report, args.out / "routing_policies.png")
    for run in runs:
        run.pop("ttft_ms_sorted")
    (args.out / "routing_policies.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'policy':16s} {'hit/oracle':>10s} {'p50':>8s} {'p99':>9s} {'hotspot':>8s} "
          f"{'goodput':>8s} {'errors':>6s}")  # fmt: skip
    for run in runs:
        print(f"{run['policy']:16s} {run['prefix_hit_rate'] / max(oracle, 1e-9):10.1%} "
              f"{run['ttft_p50_ms']:8.0f} {run['ttft_p99_ms']:9.0f} {run['hotspot_factor']:8.2f} "
              f"{run['goodput_rps']:8.1f} {sum(run['errors'].values()):6d}")  # fmt: skip
    print(f"wrote {args.out}/routing_policies.json and .png (logs: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
