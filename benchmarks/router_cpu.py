"""Router CPU per request, against bare proxies in front of the same engine, in one run.

One sim engine (a colocated worker, the H100 profile so that it is never what waits)
serves three front doors: the pdserve router as users get it (default settings), and
the two bare proxies of ``benchmarks/bare_proxy.py`` (aiohttp.web; FastAPI on uvicorn).
For each scenario and front door, ``--concurrency`` clients send ``--requests`` requests
and the front door's process CPU time (user + system, psutil) is divided by the requests.
Front doors take turns within each round, in an order that rotates between rounds; each
number is the median over ``--rounds``.

Scenarios: a one-word prompt with max_tokens=1, whole and streamed; new prompts (a
prefix never seen before) of 2k and 8k tokens with max_tokens=1; one-word prompts
streaming 64 and 512 tokens, a chunk per token (vLLM's default); and 512 tokens at 4 and
16 tokens a chunk (the request's ``stream_interval``, as vLLM 0.32 takes it). Derived:
CPU per relayed output token ((a 512-token stream - short_stream) / 511, per chunking),
tokenization alone of the same 2k and 8k prompts (in this process, the router's
tokenizer), and requests per second per router core (1 / CPU per request).

    python -m benchmarks.router_cpu [--requests 200] [--rounds 3] [--only short_stream,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import psutil

from agent import process_group
from benchmarks.reference_router import start_reference_router
from contracts.machine import machine_record
from contracts.tokenization import load_tokenizer
from loadgen.prometheus_text import scrape, total
from loadgen.words import WordSource
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama

MODEL = tiny_llama.SERVED_NAME
WARM = 24  # requests per measurement sent before the clock starts
# CPU per *served* request is measured: with the shipped 2 s TTFT SLO, admission refuses
# (cheaply, with a 429) much of the 2k/8k load, because on a 2-core box the router, the
# clients and the engine share the cores and prefills queue behind the router's own
# tokenizing. Every router measured here runs with the SLO opened; nothing else changes.
ROUTER_ENV = {"PDSERVE_TTFT_SLO_S": "3600"}
DOORS = ("router", "aiohttp", "fastapi")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    prompt_tokens: int  # 1: one word, the same each time; more: a new prompt each request
    max_tokens: int
    stream: bool
    share: float = 1.0  # of --requests (or --stream-requests): long prompts take fewer
    stream_interval: int | None = None  # tokens per streamed chunk; None: the engine's (1)


SCENARIOS = (
    Scenario("short", 1, 1, False),
    Scenario("short_stream", 1, 1, True),
    Scenario("prompt_2k", 2000, 1, False, share=0.5),
    Scenario("prompt_8k", 8000, 1, False, share=0.25),
    Scenario("stream_64", 1, 64, True),
    Scenario("stream_512", 1, 512, True),
    Scenario("stream_512_every_4", 1, 512, True, stream_interval=4),
    Scenario("stream_512_every_16", 1, 512, True, stream_interval=16),
)


def bodies(scenario: Scenario, words: WordSource, count: int, salt: str) -> list[bytes]:
    def prompt(i: int) -> str:
        if scenario.prompt_tokens == 1:
            return "hello"
        return words.run(f"{salt}-{scenario.name}-{i}", scenario.prompt_tokens)

    chunking = (
        {} if scenario.stream_interval is None else {"stream_interval": scenario.stream_interval}
    )
    return [
        json.dumps({"model": MODEL, "prompt": prompt(i), "max_tokens": scenario.max_tokens,
                    "stream": scenario.stream, "ignore_eos": True, **chunking}).encode()
        for i in range(count)
    ]  # fmt: skip


async def load(url: str, payloads: list[bytes], concurrency: int) -> dict[str, int]:
    """Send every payload, ``concurrency`` at a time; the answers that were not a whole
    200, by status (a stream without ``[DONE]`` is ``truncated``)."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for payload in payloads:
        queue.put_nowait(payload)
    failures: dict[str, int] = {}

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            payload = queue.get_nowait()
            async with session.post(
                url + "/v1/completions", data=payload, headers={"Content-Type": "application/json"}
            ) as answer:
                body = await answer.read()
                streamed = b'"stream": true' in payload
                if answer.status != 200:
                    failures[str(answer.status)] = failures.get(str(answer.status), 0) + 1
                elif streamed and b"data: [DONE]" not in body:
                    failures["truncated"] = failures.get("truncated", 0) + 1

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return failures


def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def system_cpu_s(pid: int) -> float:
    """The kernel's share (syscalls; on loopback a send also runs the receiver's TCP path)."""
    return psutil.Process(pid).cpu_times().system


def idle_cpu_ms_per_s(pid: int, seconds: float = 5.0) -> float:
    """A door's CPU with no request in flight (the router's probes, heartbeats, metrics):
    what a long measurement charges per second whatever the requests cost."""
    before = cpu_s(pid)
    time.sleep(seconds)  # the point is to measure an idle interval
    return round(1000 * (cpu_s(pid) - before) / seconds, 3)


def measure(url: str, pid: int, payloads: list[bytes], concurrency: int, *,
            tokenize_metric_url: str | None = None) -> dict:  # fmt: skip
    """``tokenize_metric_url``: the router's /metrics, for the CPU its own tokenizing took
    in the same requests (read outside the CPU measurement)."""
    # Warm: connections, caches, and admission's per-worker prefill rate (it starts from
    # a prior and learns from the prefills it admits).
    asyncio.run(load(url, payloads[:WARM], concurrency))
    tokenized_before = _tokenize_cpu_s(tokenize_metric_url)
    started_cpu, started_system, started = cpu_s(pid), system_cpu_s(pid), time.monotonic()
    failures = asyncio.run(load(url, payloads[WARM:], concurrency))
    requests = len(payloads) - WARM
    cpu = cpu_s(pid) - started_cpu
    system = system_cpu_s(pid) - started_system
    result = {"requests": requests, "failures": failures, "cpu_s": round(cpu, 4),
              "wall_s": round(time.monotonic() - started, 3),
              "cpu_ms_per_request": round(1000 * cpu / requests, 4),
              "system_cpu_ms_per_request": round(1000 * system / requests, 4)}  # fmt: skip
    if tokenize_metric_url is not None:
        tokenized_s = _tokenize_cpu_s(tokenize_metric_url) - tokenized_before
        result["tokenize_cpu_ms_per_request"] = round(1000 * tokenized_s / requests, 4)
    return result


def _tokenize_cpu_s(metrics_url: str | None) -> float:
    if metrics_url is None:
        return 0.0
    return total(scrape(metrics_url), "pdserve_tokenize_cpu_seconds_sum")


def tokenization_ms(words: WordSource, model_dir: Path, tokens: int, count: int) -> float:
    tokenizer = load_tokenizer(str(model_dir))
    prompts = [words.run(f"tok-{tokens}-{i}", tokens) for i in range(count)]
    started = time.process_time()
    for prompt in prompts:
        tokenizer.encode(prompt, add_special_tokens=True)
    return 1000 * (time.process_time() - started) / count


def start_doors(run_dir: Path, engine_url: str) -> dict[str, tuple[str, object]]:
    doors = {}
    for kind, port in zip(("aiohttp", "fastapi"), free_ports(2), strict=True):
        argv = [sys.executable, "-m", "benchmarks.bare_proxy", "--kind", kind, "--port",
                str(port), "--engine", engine_url]  # fmt: skip
        process = process_group.spawn(argv, env=dict(os.environ), log_path=run_dir / f"{kind}.log")
        url = f"http://127.0.0.1:{port}"
        doors[kind] = (url, process)
    for kind, (url, process) in doors.items():
        process_group.wait_until(
            lambda u=url: _answers(u), timeout_s=30, what=f"{kind} proxy", process=process
        )
    return doors


def _answers(url: str) -> bool:
    try:
        asyncio.run(load(url, [json.dumps({"model": MODEL, "prompt": "hi",
                                           "max_tokens": 1}).encode()], 1))  # fmt: skip
    except aiohttp.ClientError:
        return False
    return True


def run(args: argparse.Namespace) -> dict:
    model_dir = tiny_llama.ensure()
    words = WordSource(load_tokenizer(str(model_dir)))
    run_dir = Path(tempfile.mkdtemp(prefix="router-cpu-"))
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=model_dir, served_name=MODEL, prefill=0, decode=0, colocated=1, port=port,
        run_dir=run_dir, engine="sim", sim_profile="llama3-8b-h100", max_model_len=16384,
        ready_timeout_s=120, heartbeat_interval_s=2.0, drain_timeout_s=2,
        router_env=ROUTER_ENV,
    )  # fmt: skip
    cluster = LocalCluster(plan)
    cluster.start()
    proxies: list = []
    try:
        engine = cluster.workers[0].engine_url
        doors = start_doors(run_dir, engine)
        proxies = [process for _, process in doors.values()]
        assert cluster.router is not None
        targets = {"router": (cluster.router_url, cluster.router.pid),
                   **{k: (url, process.pid) for k, (url, process) in doors.items()}}  # fmt: skip
        if args.ref_tree:
            url, process = start_reference_router(args.ref_tree, cluster, run_dir, ROUTER_ENV)
            proxies.append(process)
            targets["router_ref"] = (url, process.pid)
        names = tuple(targets)
        idle = {door: idle_cpu_ms_per_s(pid) for door, (_, pid) in targets.items()}
        print(f"idle CPU ms per second: {idle}", flush=True)
        results: dict[str, dict[str, list[dict]]] = {d: {} for d in names}
        partial = args.out.with_suffix(".partial.json")
        partial.parent.mkdir(parents=True, exist_ok=True)
        for round_index in range(args.rounds):
            turn = round_index % len(names)
            order = names[turn:] + names[:turn]
            for scenario in scenarios(args.only):
                many = args.requests if scenario.max_tokens < 64 else args.stream_requests
                count = round(many * scenario.share) + WARM
                for door in order:
                    url, pid = targets[door]
                    payloads = bodies(scenario, words, count, salt=f"{door}-{round_index}")
                    metric_url = url + "/metrics" if door.startswith("router") else None
                    result = measure(url, pid, payloads, args.concurrency,
                                     tokenize_metric_url=metric_url)  # fmt: skip
                    results[door].setdefault(scenario.name, []).append(result)
                    # Kept as it comes: a crash later loses no measurement.
                    partial.write_text(json.dumps(results, indent=1))
                    print(f"round {round_index + 1}/{args.rounds} {scenario.name:<13} {door:<8} "
                          f"{result['cpu_ms_per_request']:8.3f} ms CPU/request "
                          f"(not 200: {result['failures'] or 'none'})", flush=True)  # fmt: skip
    finally:
        process_group.stop(proxies, grace_s=5)
        cluster.stop()
    tokenize = {
        str(s.prompt_tokens): round(tokenization_ms(words, model_dir, s.prompt_tokens, 50), 4)
        for s in scenarios(args.only)
        if s.prompt_tokens > 1
    }
    return summarize(results, tokenize, args, idle)


def scenarios(only: str | None) -> tuple[Scenario, ...]:
    """``--only``: a comma-separated list of scenario names (the per-token figures need
    ``short_stream``)."""
    if not only:
        return SCENARIOS
    names = set(only.split(","))
    unknown = names - {s.name for s in SCENARIOS}
    if unknown:
        raise SystemExit(f"--only: no scenario {', '.join(sorted(unknown))}")
    return tuple(s for s in SCENARIOS if s.name in names)


def summarize(
    results: dict, tokenize: dict, args: argparse.Namespace, idle: dict[str, float]
) -> dict:
    median = _medians(results, "cpu_ms_per_request")
    # Net of each door's idle CPU over the measurement's wall time: what the requests cost.
    net = {
        door: {name: statistics.median(
                   r["cpu_ms_per_request"] - idle[door] * r["wall_s"] / r["requests"]
                   for r in runs)
               for name, runs in per_door.items()}
        for door, per_door in results.items()
    }  # fmt: skip
    # Per chunking: a chunk per token, then 4 and 16 tokens a chunk.
    per_token = {
        name: {door: round((m[name] - m["short_stream"]) / 511, 5) for door, m in median.items()}
        for name in (s.name for s in SCENARIOS if s.max_tokens == 512)
        if "short_stream" in median["router"] and name in median["router"]
    }
    per_token_net = {
        name: {door: round((m[name] - m["short_stream"]) / 511, 5) for door, m in net.items()}
        for name in per_token
    }
    router = median["router"]
    own_tokenize = {
        name: statistics.median(r.get("tokenize_cpu_ms_per_request", 0.0) for r in runs)
        for name, runs in results["router"].items()
    }  # fmt: skip
    return {
        "command": "python -m benchmarks.router_cpu " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": {**machine_record(), "python": platform.python_version()},
        "router_env": ROUTER_ENV,
        "settings": {
            "requests": args.requests,
            "stream_requests": args.stream_requests,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
        },
        "scenarios": [asdict(s) for s in scenarios(args.only)],
        "cpu_ms_per_request_median": median,
        "cpu_ms_per_output_token": per_token,
        "idle_cpu_ms_per_s": idle,
        "cpu_ms_per_output_token_net_of_idle": per_token_net,
        "system_cpu_ms_per_request_median": _medians(results, "system_cpu_ms_per_request"),
        "tokenization_alone_ms": tokenize,
        "router_over_aiohttp": {n: round(router[n] / median["aiohttp"][n], 2) for n in router},
        "router_over_router_ref": {n: round(router[n] / median["router_ref"][n], 2) for n in router}
        if "router_ref" in median
        else None,
        "router_over_fastapi": {n: round(router[n] / median["fastapi"][n], 2) for n in router},
        "router_2k_over_tokenization": _ratio(router.get("prompt_2k"), tokenize.get("2000")),
        "router_8k_over_tokenization": _ratio(router.get("prompt_8k"), tokenize.get("8000")),
        # The same ratio against the router's own tokenizing in the same requests (its
        # tokenizing thread's CPU time, from pdserve_tokenize_cpu_seconds): one run, one
        # process, one load, where the idle reference above ran alone after the run.
        "router_tokenize_cpu_ms_per_request": own_tokenize,
        "router_over_own_tokenization": {
            n: round(router[n] / own_tokenize[n], 2)
            for n in ("prompt_2k", "prompt_8k")
            if own_tokenize.get(n)
        },
        "router_requests_per_core_s": {n: round(1000 / v, 1) for n, v in router.items()},
        "not_200": {
            door: {name: [r["failures"] for r in runs] for name, runs in per.items()}
            for door, per in results.items()
        },
        "runs": results,
    }


def _medians(results: dict, key: str) -> dict[str, dict[str, float]]:
    return {
        door: {name: statistics.median(r.get(key, 0.0) for r in runs)
               for name, runs in per_door.items()}
        for door, per_door in results.items()
    }  # fmt: skip


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else round(numerator / denominator, 2)


def plot(summary: dict, path: Path) -> None:
    names = [s["name"] for s in summary["scenarios"]]
    figure, axis = plt.subplots(figsize=(10, 4.5))
    doors = list(summary["cpu_ms_per_request_median"])
    width = 0.8 / len(doors)
    for i, door in enumerate(doors):
        values = [summary["cpu_ms_per_request_median"][door][n] for n in names]
        offset = (i - (len(doors) - 1) / 2) * width
        axis.bar([x + offset for x in range(len(names))], values, width, label=door)
    axis.set_xticks(range(len(names)), names)
    axis.set_yscale("log")
    axis.set_ylabel("CPU ms per request (median of rounds)")
    axis.set_title("Router CPU per request against bare proxies, same engine, same run")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--stream-requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma-separated scenario names")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/router_cpu"))
    parser.add_argument(
        "--ref-tree",
        type=Path,
        default=None,
        help="also measure the router of this checkout (before a change)",
    )
    args = parser.parse_args()
    summary = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary, args.out.with_suffix(".png"))
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "cpu_ms_per_request_median",
                    "cpu_ms_per_output_token",
                    "cpu_ms_per_output_token_net_of_idle",
                    "system_cpu_ms_per_request_median",
                    "tokenization_alone_ms",
                    "router_over_aiohttp",
                    "not_200",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
