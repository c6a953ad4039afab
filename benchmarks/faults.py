"""The fault matrix: each failure injected again and again under steady load, and what
every client saw.

Starts a P/D cluster (sims by default: ``--engine vllm`` for real engines on the tiny
model) with the router's shipped settings, keeps ``--clients`` closed-loop clients
streaming greedy completions whose answers were recorded before any fault, and runs
each scenario ``--injections`` times (``benchmarks/fault_scenarios.py`` says what each
injects). Every request started during a scenario is judged:

- ``complete``: 200, ``[DONE]``, and the text recorded for its prompt;
- ``error``: a clear error, an OpenAI error body or an SSE error event;
- ``truncated``: a 200 whose text is cut or wrong without an error: never allowed;
- ``hang``: no byte for 30 s: never allowed;
- ``cut``: the connection broke mid-answer with no SSE error event (the client sees a
  connection error): allowed only where the router itself was killed (``kill_router``).

The cluster has ``--replicas`` router replicas sharing one redis-server, as production
does; client ``i`` talks to replica ``i mod replicas``, and outcomes are also counted per
replica (a killed replica's own clients apart from the others').

A client waits ``BACKOFF_S`` after a 429, a 503 or a broken connection (as OpenAI's SDKs
back off), so an outage counts about one error a second per client, not one per round
trip.

Per injection: ``served_s`` (until a request sent after it completes) and ``whole_s``
(until every worker is back in rotation); per scenario, the longest any client waited
for its next token. After each scenario the load stops and each
engine's KV usage, read from its own ``/metrics`` (``vllm:kv_cache_usage_perc``), must
fall back to its idle baseline: ``kv_settled_s`` says when it did.

    python -m benchmarks.faults [--engine sim] [--injections 20] [--scenarios a,b]

Writes ``faults.json``, ``faults.md`` and ``faults.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from agent import process_group
from benchmarks.fault_report import OUTCOMES, markdown, plot
from benchmarks.fault_scenarios import SCENARIOS, FaultTarget, Scenario
from contracts.machine import machine_record
from loadgen.client import RequestResult, stream_request
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from localrun.redis_server import RedisServer
from modelstore import tiny_llama

HANG_S = 30.0  # the bound: no byte for this long is a hang
KV_SETTLE_LIMIT_S = 60.0
BACKOFF_S = 1.0  # a client's wait after a 429 or 503 before its next request
PROMPTS = 12


@dataclass
class Load:
    """Closed-loop clients streaming known prompts; every result, judged."""

    urls: list[str]  # each replica's completions URL
    references: dict[int, str]
    bodies: dict[int, dict]
    clients: int
    results: list[tuple[int, RequestResult, str]] = field(default_factory=list)  # replica
    running: bool = False
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> None:
        self.running = True
        self._tasks = [asyncio.create_task(self._client(seed)) for seed in range(self.clients)]

    async def stop(self) -> None:
        self.running = False
        await asyncio.gather(*self._tasks)

    async def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        replica = seed % len(self.urls)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=HANG_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while self.running:
                prompt = rng.randrange(PROMPTS)
                result = await stream_request(session, self.urls[replica], self.bodies[prompt],
                                              keep_text=True)  # fmt: skip
                self.results.append((replica, result, judge(result, self.references[prompt])))
                if result.status in (429, 503) or self.results[-1][2] == "cut":
                    await asyncio.sleep(BACKOFF_S)  # as OpenAI's SDKs back off


_CONNECTION_ERRORS = ("ServerDisconnectedError", "ClientPayloadError", "ClientConnectorError",
                      "ClientOSError")  # fmt: skip


def judge(result: RequestResult, reference: str) -> str:
    error = result.error or ""
    if "TimeoutError" in error or "ServerTimeoutError" in error:
        return "hang"
    if error.startswith(_CONNECTION_ERRORS):
        return "cut"
    if result.status != 200 or error.startswith("stream error"):
        return "error"
    if error or result.text != reference:
        return "truncated"
    return "complete"


async def references(url: str, bodies: dict[int, dict]) -> dict[int, str]:
    """Each prompt's answer with nothing failing (greedy: the answer it must get)."""
    async with aiohttp.ClientSession() as session:
        answers = {}
        for prompt, body in bodies.items():
            result = await stream_request(session, url, body, keep_text=True)
            if not result.ok:
                raise RuntimeError(f"the reference answer failed: {result.error}")
            answers[prompt] = result.text
    return answers


async def kv_settled_s(target: FaultTarget) -> dict[str, float]:
    """Seconds until each engine's KV usage is back at its idle baseline (inf: not within
    KV_SETTLE_LIMIT_S), read from the engines themselves."""
    started = time.perf_counter()
    settled: dict[str, float] = {}
    while (
        len(settled) < len(target.kv_baseline) and time.perf_counter() - started < KV_SETTLE_LIMIT_S
    ):
        for name, used in (await target.kv_usage()).items():
            if name not in settled and used <= target.kv_baseline[name] + 1e-9:
                settled[name] = round(time.perf_counter() - started, 2)
        await asyncio.sleep(0.2)
    return {name: settled.get(name, float("inf")) for name in target.kv_baseline}


async def run_scenario(
    scenario: Scenario, target: FaultTarget, load: Load, injections: int, t0: float
) -> dict:
    started_s = time.perf_counter()
    counted_before = await target.router_counters()
    load.start()
    await asyncio.sleep(2.0)  # steady load before the first injection
    record = []
    for _ in range(injections):
        injected_s = time.perf_counter()
        what = await scenario.inject(target)
        whole_s = None
        while whole_s is None and time.perf_counter() - injected_s < 300:
            if await target.whole():
                whole_s = time.perf_counter() - injected_s
            await asyncio.sleep(0.1)
        record.append({"injected_s": injected_s, "what": what, "whole_s": _rounded(whole_s)})
        await asyncio.sleep(scenario.gap_s)
    await load.stop()
    ended_s = time.perf_counter()
    judged = [(r, o) for _, r, o in load.results if started_s <= r.started_s <= ended_s]
    by_replica = Counter(
        (replica, o) for replica, r, o in load.results if started_s <= r.started_s <= ended_s
    )
    load.results.clear()
    for injection in record:
        injected_s = injection.pop("injected_s")
        injection["at_s"] = round(injected_s - t0, 2)
        injection["served_s"] = _rounded(served_after(judged, injected_s))
    settled = await kv_settled_s(target)
    counted = await target.router_counters()
    return {
        "scenario": scenario.name,
        "what": scenario.description,
        "injections": record,
        "requests": len(judged),
        "outcomes": {o: sum(1 for _, got in judged if got == o) for o in OUTCOMES},
        "outcomes_by_replica": [
            {o: by_replica[replica, o] for o in OUTCOMES} for replica in range(len(load.urls))
        ],
        "worst_wait_s": _rounded(max((longest_wait(r) for r, _ in judged), default=None)),
        "errors": dict(Counter((r.error or "")[:80] for r, o in judged if o != "complete")),
        "kv_settled_s": settled,
        "router_counted": {k: round(v - counted_before[k]) for k, v in counted.items()},
        "started_at_s": round(started_s - t0, 2),
        "ended_at_s": round(ended_s - t0, 2),
    }


def never_allowed(scenario: dict) -> int:
    """Truncated 200s and hangs anywhere; cut connections where no router was killed."""
    counts = scenario["outcomes"]
    cut_allowed = SCENARIOS[scenario["scenario"]].cuts_allowed
    return counts["truncated"] + counts["hang"] + (0 if cut_allowed else counts["cut"])


def served_after(judged: list[tuple[RequestResult, str]], at_s: float) -> float | None:
    """Until the first request sent after ``at_s`` completed with its recorded answer."""
    ends = [r.started_s + r.e2e_s for r, o in judged if o == "complete" and r.started_s >= at_s]
    return min(ends) - at_s if ends else None


def longest_wait(result: RequestResult) -> float:
    """The longest a client waited for its next token (its first included)."""
    return max([result.ttft_s or 0.0, *result.itl_s])


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@contextlib.contextmanager
def fault_target(args: argparse.Namespace) -> Iterator[FaultTarget]:
    """redis-server, then the extra router replicas, then the cluster (its router first)."""
    run_dir = Path(tempfile.mkdtemp(prefix="pdserve-faults-"))
    redis = RedisServer(run_dir)
    redis.start()
    port, *extra_ports = free_ports(args.replicas)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=tiny_llama.SERVED_NAME,
        prefill=args.prefill, decode=args.decode, port=port, engine=args.engine,
        run_dir=run_dir, ready_timeout_s=600 if args.engine == "vllm" else 120,
        max_model_len=2048, router_env={"PDSERVE_STATE_URL": redis.url},
        extra_router_urls=tuple(f"http://127.0.0.1:{p}" for p in extra_ports),
    )  # fmt: skip
    cluster = LocalCluster(plan, say=lambda line: print("  " + line, flush=True))
    target = FaultTarget(cluster, redis)
    try:
        for url in plan.extra_router_urls:
            target.replicas[url] = cluster.start_replica(url)
        cluster.start()
        yield target
    finally:
        cluster.stop()
        process_group.stop(list(target.replicas.values()), grace_s=15)
        redis.stop()
        print(f"  logs: {run_dir}")


async def measure(
    args: argparse.Namespace, target: FaultTarget, write: Callable[[dict], None]
) -> dict:
    """Every scenario in turn; the report so far is written after each (``write``), so a
    run stopped part way keeps the scenarios it finished."""
    machine = machine_record()  # the commit the run started on, not the one it ends on
    cluster = target.cluster
    urls = [u + "/v1/completions" for u in (cluster.router_url, *cluster.plan.extra_router_urls)]
    rng = random.Random(args.seed)
    bodies = {
        i: {"model": tiny_llama.SERVED_NAME, "temperature": 0, "ignore_eos": True,
            "prompt": f"fault matrix prompt {i}: " + "tell me a story " * rng.randint(4, 40),
            "max_tokens": rng.randint(args.max_tokens // 4, args.max_tokens)}
        for i in range(PROMPTS)
    }  # fmt: skip
    answers = await references(urls[0], bodies)
    await target.learn_kv_baseline()
    load = Load(urls, answers, bodies, args.clients)
    t0 = time.perf_counter()
    chosen = [SCENARIOS[name] for name in args.scenarios.split(",")] if args.scenarios else [
        s for s in SCENARIOS.values()
        if args.engine in s.engines and args.replicas >= s.replicas]  # fmt: skip
    report = {
        "title": f"Faults under load ({args.engine}: {args.prefill}P + {args.decode}D, "
        f"{args.replicas} router replicas)",
        "machine": machine,
        "command": "python -m benchmarks.faults " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "clients": args.clients,
        "scenarios": [],
    }
    for scenario in chosen:
        print(f"{scenario.name}: {args.injections} injections", flush=True)
        result = await run_scenario(scenario, target, load, args.injections, t0)
        print(f"  {result['outcomes']}; KV settled {result['kv_settled_s']}", flush=True)
        report["scenarios"].append(result)
        write(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--prefill", type=int, default=2)
    parser.add_argument("--decode", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2, help="router replicas (one Redis)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--injections", type=int, default=20)
    parser.add_argument("--scenarios", default="", help="names, comma-separated; default: all")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    stem = "faults" if args.engine == "sim" else f"faults_{args.engine}"
    args.out.mkdir(parents=True, exist_ok=True)

    def write(report: dict) -> None:
        (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2))
        (args.out / f"{stem}.md").write_text(markdown(report))
        plot(report, args.out / f"{stem}.png")

    with fault_target(args) as target:
        report = asyncio.run(measure(args, target, write))
    bad = sum(never_allowed(s) for s in report["scenarios"])
    print(f"wrote {args.out}/{stem}.json, .md and .png")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
