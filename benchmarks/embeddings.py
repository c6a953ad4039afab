"""Embeddings through the router against the engine alone, and cut across workers or not.

Part 1, the router's cost (the issue's bar: at least 0.95x the engine's tokens/s at the
same concurrency). A router and one embedding worker bound to every core
(all-MiniLM-L6-v2 on vLLM's pooling runner), as ``pdserve up --embed 1`` starts it.
``pdserve bench --endpoint embeddings`` sends the same workload to the engine's own
``/v1/embeddings`` and to the router's, alternating which goes first round by round so
that drift on this shared box hits both alike: requests of INPUTS texts each, lengths
log-normal (mean LENGTH tokens, sigma 0.8: mostly short, a long tail cut at the
model's 256-token context and counted), MAX_CONCURRENCY in flight. A warm-up of
``--warm-up`` requests to each comes first and is kept apart: vLLM's CPU engine keeps
getting faster for hundreds of requests of new lengths (after a 20-request warm-up its
own tokens/s rose round by round, 3,279, 3,378, 3,582, and router / engine fell from 1.29
to 1.02). Then ``vllm bench serve
--backend openai-embeddings`` runs once against each (its random dataset), for its
failures and numbers.

Part 2, cutting large requests (``embedding_split_min_inputs``). A router and two
workers, one core each; requests of LARGE inputs each, sent one at a time (latency)
and MAX_CONCURRENCY at a time (throughput), on a router that cuts them (the default,
32) and on one that never does (0): one cluster each, started in turn, twice
(A B A B), each warmed with WARM_UP_LARGE such requests first. Each run counts the
requests the router cut (``pdserve_embedding_splits_total``).

    python -m benchmarks.embeddings [--rounds 4] [--split-rounds 2] [--warm-up 300]

Writes ``benchmarks/results/embeddings.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_clients import pdserve_bench, vllm_bench_serve
from contracts.machine import describe, machine_record
from loadgen.metrics import percentiles
from loadgen.prometheus_text import scrape, total
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import minilm

MODEL = minilm.SERVED_NAME
INPUTS, LENGTH, REQUESTS, MAX_CONCURRENCY = 8, 64, 200, 4
LARGE, LARGE_LENGTH, LARGE_REQUESTS = 256, 32, 16
WARM_UP_LARGE = 8
SPLIT_SETTINGS = {"cut": "32", "never cut": "0"}


def workload(url: str, *, inputs: int, length: int, requests: int, concurrency: int,
             seed: int) -> list[str]:  # fmt: skip
    return [
        "--url", url, "--model", MODEL, "--tokenizer", "minilm", "--endpoint", "embeddings",
        "--dataset", "random", "--input-len", str(length), "--len-dist", "lognormal",
        "--range-ratio", "0.8", "--inputs-per-request", str(inputs),
        "--num-requests", str(requests), "--max-concurrency", str(concurrency),
        "--rates", "inf", "--seed", str(seed),
    ]  # fmt: skip


def row(run: dict, target: str, **extra: object) -> dict:
    summary = run["summary"]
    e2e = summary["e2e_ms"]
    return {
        "target": target, **extra,
        "requests": summary["requests"], "failed": summary["failed"],
        "errors": summary["errors"], "duration_s": round(summary["duration_s"], 3),
        "requests_per_s": round(summary["request_throughput"], 3),
        "input_tokens_per_s": round(summary["total_token_throughput"], 1),
        "latency_ms": {k: round(v, 1) for k, v in e2e.items() if v is not None},
        "latencies_ms": [s["e2e_ms"] for s in run["samples"] if s["error"] is None],
    }  # fmt: skip


def start(plan: ClusterPlan) -> LocalCluster:
    cluster = LocalCluster(plan, say=lambda m: print(f"bench: {m}", flush=True))
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def cut_requests(router_url: str) -> float:
    return total(scrape(router_url + "/metrics"), "pdserve_embedding_splits_total", model=MODEL)


def router_against_engine(work: Path, rounds: int, warm_up: int) -> dict:
    (port,) = free_ports(1)
    model = minilm.ensure()
    plan = ClusterPlan(model_path=model, served_name=MODEL, prefill=0, decode=0, embed=1,
                       embed_model_path=model, embed_served_name=MODEL, port=port,
                       run_dir=work / "one-worker")  # fmt: skip
    cluster = start(plan)
    urls = {"engine": cluster.worker("embed-0").engine_url, "router": cluster.router_url}
    runs, warm_runs, vllm_bench = [], [], []
    try:
        for target, url in urls.items():
            argv = workload(url, inputs=INPUTS, length=LENGTH, requests=warm_up,
                            concurrency=MAX_CONCURRENCY, seed=99)  # fmt: skip
            run = pdserve_bench(argv, work / f"warm-{target}", work / f"warm-{target}.log")
            warm_runs.append(row(run, target))
        for index in range(rounds):
            order = list(urls) if index % 2 == 0 else list(reversed(urls))
            for target in order:
                argv = workload(urls[target], inputs=INPUTS, length=LENGTH, requests=REQUESTS,
                                concurrency=MAX_CONCURRENCY, seed=index)  # fmt: skip
                name = f"round{index}-{target}"
                run = pdserve_bench(argv, work / name, work / f"{name}.log")
                runs.append(row(run, target, round=index))
                print(f"bench: {name}: {runs[-1]['input_tokens_per_s']} tokens/s, p99 "
                      f"{runs[-1]['latency_ms'].get('p99')} ms", flush=True)  # fmt: skip
        for target, url in urls.items():
            vllm_bench.append({"target": target, **vllm_embeddings(url, model, work, target)})
    finally:
        cluster.stop()
    return {"runs": runs, "warm_up": warm_runs, "vllm_bench_serve": vllm_bench}


def vllm_embeddings(url: str, model: Path, work: Path, target: str) -> dict:
    argv = [
        "--backend", "openai-embeddings", "--base-url", url, "--endpoint", "/v1/embeddings",
        "--model", MODEL, "--tokenizer", str(model), "--dataset-name", "random",
        "--random-input-len", str(LENGTH), "--num-prompts", str(REQUESTS),
        "--max-concurrency", str(MAX_CONCURRENCY), "--request-rate", "inf", "--disable-tqdm",
    ]  # fmt: skip
    result = vllm_bench_serve(argv, work / f"vllm-bench-{target}.log")
    keys = ("completed", "failed", "request_throughput", "total_token_throughput",
            "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms")  # fmt: skip
    return {k: result.get(k, REQUESTS - result.get("completed", 0) if k == "failed" else None)
            for k in keys}  # fmt: skip


def cut_or_not(work: Path, rounds: int) -> list[dict]:
    model = minilm.ensure()
    rows = []
    for index in range(rounds):
        for setting, value in SPLIT_SETTINGS.items():
            (port,) = free_ports(1)
            plan = ClusterPlan(
                model_path=model, served_name=MODEL, prefill=0, decode=0, embed=2,
                embed_model_path=model, embed_served_name=MODEL, port=port,
                run_dir=work / f"two-workers-{index}-{value}",
                router_env={"PDSERVE_EMBEDDING_SPLIT_MIN_INPUTS": value},
            )  # fmt: skip
            cluster = start(plan)
            url = cluster.router_url
            try:
                argv = workload(url, inputs=LARGE, length=LARGE_LENGTH, requests=WARM_UP_LARGE,
                                concurrency=MAX_CONCURRENCY, seed=98)  # fmt: skip
                name = f"split{index}-{value}-warm"
                pdserve_bench(argv, work / name, work / f"{name}.log")
                for concurrency in (1, MAX_CONCURRENCY):
                    argv = workload(url, inputs=LARGE, length=LARGE_LENGTH,
                                    requests=LARGE_REQUESTS, concurrency=concurrency,
                                    seed=10 + index)  # fmt: skip
                    name = f"split{index}-{value}-c{concurrency}"
                    before = cut_requests(url)
                    run = pdserve_bench(argv, work / name, work / f"{name}.log")
                    rows.append(row(run, setting, round=index, concurrency=concurrency,
                                    cut_requests=cut_requests(url) - before))  # fmt: skip
                    print(f"bench: {name}: p50 {rows[-1]['latency_ms'].get('p50')} ms, "
                          f"{rows[-1]['input_tokens_per_s']} tokens/s, "
                          f"{rows[-1]['cut_requests']:.0f} cut", flush=True)  # fmt: skip
            finally:
                cluster.stop()
    return rows


def summarise(part1: dict, split_rows: list[dict]) -> dict:
    runs = part1["runs"]
    by = {t: [r for r in runs if r["target"] == t] for t in ("engine", "router")}
    per_round = [
        router["input_tokens_per_s"] / engine["input_tokens_per_s"]
        for engine, router in zip(by["engine"], by["router"], strict=True)
    ]
    pooled = {t: [ms for r in rows for ms in r["latencies_ms"]] for t, rows in by.items()}
    summary = {
        "router_over_engine_tokens_per_s": {
            "mean_of_rounds": round(statistics.fmean(per_round), 3),
            "per_round": [round(x, 3) for x in per_round],
        },
        "tokens_per_s": {
            t: round(statistics.fmean(r["input_tokens_per_s"] for r in rows), 1)
            for t, rows in by.items()
        },
        "latency_p50_p99_ms_pooled": {t: _p50_p99_ms(v) for t, v in pooled.items()},
        "failed": {t: sum(r["failed"] for r in rows) for t, rows in by.items()},
    }
    cut = {}
    for concurrency in sorted({r["concurrency"] for r in split_rows}):
        mine = {s: [r for r in split_rows if r["target"] == s and r["concurrency"] == concurrency]
                for s in SPLIT_SETTINGS}  # fmt: skip
        cut[f"concurrency {concurrency}"] = {
            s: {"p50_ms": round(statistics.fmean(r["latency_ms"]["p50"] for r in rows), 1),
                "tokens_per_s": round(statistics.fmean(r["input_tokens_per_s"] for r in rows), 1),
                "failed": sum(r["failed"] for r in rows),
                "cut": f"{sum(r['cut_requests'] for r in rows):.0f} of "
                       f"{sum(r['requests'] for r in rows)}"}
            for s, rows in mine.items()
        }  # fmt: skip
    summary["cut_across_two_workers"] = cut
    return summary


def _p50_p99_ms(latencies_ms: list[float]) -> list[float | None]:
    """``pdserve bench``'s own percentiles (loadgen.metrics) of milliseconds."""
    found = percentiles([ms / 1000 for ms in latencies_ms])
    return [None if found[q] is None else round(found[q], 1) for q in ("p50", "p99")]


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate, cdf, cut) = plt.subplots(1, 3, figsize=(16, 4.5))
    runs = result["part1"]["runs"]
    for target, colour in (("engine", "tab:blue"), ("router", "tab:orange")):
        mine = [r for r in runs if r["target"] == target]
        rate.plot([r["round"] for r in mine], [r["input_tokens_per_s"] for r in mine], "o-",
                  color=colour, label=target)  # fmt: skip
        pooled = sorted(ms for r in mine for ms in r["latencies_ms"])
        cdf.plot(pooled, [(i + 1) / len(pooled) for i in range(len(pooled))], color=colour,
                 label=target)  # fmt: skip
    rate.set(title=f"input tokens/s, {INPUTS} inputs/request, concurrency {MAX_CONCURRENCY}",
             xlabel="round", ylabel="tokens/s", ylim=(0, None))  # fmt: skip
    cdf.set(title="latency CDF (all rounds)", xlabel="ms", ylabel="fraction of requests")
    cut_summary = result["summary"]["cut_across_two_workers"]
    labels = list(cut_summary)
    for offset, setting in enumerate(SPLIT_SETTINGS):
        heights = [cut_summary[c][setting]["p50_ms"] for c in labels]
        cut.bar([i + 0.4 * offset for i in range(len(labels))], heights, width=0.4, label=setting)
    cut.set_xticks([i + 0.2 for i in range(len(labels))], labels)
    cut.set(title=f"{LARGE}-input requests on 2 workers: p50 latency", ylabel="ms")
    for axis in (rate, cdf, cut):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(describe(result["machine"]), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def markdown(result: dict) -> str:
    s = result["summary"]
    ratio = s["router_over_engine_tokens_per_s"]
    lines = [
        "# Embeddings: the router against the engine alone, and large requests cut or not",
        "",
        f"`{result['command']}`, {result['date']}. Machine: {describe(result['machine'])}.",
        "",
        f"## Router against engine ({INPUTS} inputs/request, log-normal lengths mean {LENGTH} "
        f"tokens, concurrency {MAX_CONCURRENCY}, {REQUESTS} requests a run)",
        "",
        f"- router / engine, input tokens/s: **{ratio['mean_of_rounds']}** "
        f"(rounds: {ratio['per_round']})",
        f"- tokens/s (mean of rounds): {s['tokens_per_s']}",
        f"- latency p50, p99 ms (all rounds pooled): {s['latency_p50_p99_ms_pooled']}",
        f"- failed: {s['failed']}",
        "",
        "`vllm bench serve --backend openai-embeddings`:",
        "",
        "| target | completed | failed | req/s | tokens/s | p99 ms |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    measured = result.get("part1_measured")
    if measured:
        note = (f"(Measured at commit {measured['commit']}, {measured['date']}: "
                f"`{measured['command']}`; the rest of the page at this run's.)\n")  # fmt: skip
        lines.insert(6, note)
    for run in result["part1"]["vllm_bench_serve"]:
        lines.append(f"| {run['target']} | {run['completed']} | {run['failed']} | "
                     f"{run['request_throughput']:.1f} | {run['total_token_throughput']:.0f} | "
                     f"{run['p99_e2el_ms']:.1f} |")  # fmt: skip
    lines += ["", f"## {LARGE}-input requests on two workers (one core each): cut or not", "",
              "| load | setting | requests cut | p50 ms | tokens/s | failed |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for load, settings in s["cut_across_two_workers"].items():
        for setting, numbers in settings.items():
            lines.append(f"| {load} | {setting} | {numbers['cut']} | {numbers['p50_ms']} | "
                         f"{numbers['tokens_per_s']} | {numbers['failed']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="engine/router pairs")
    parser.add_argument("--split-rounds", type=int, default=2, help="cut/never-cut pairs")
    parser.add_argument("--warm-up", type=int, default=300, help="requests before part 1")
    parser.add_argument("--part1-from", type=Path, default=None,
                        help="an earlier embeddings.json whose part 1 to keep (its commit "
                        "and date are recorded); only part 2 runs")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pdserve-embeddings-"))
    earlier = json.loads(args.part1_from.read_text()) if args.part1_from else None
    part1 = earlier["part1"] if earlier else router_against_engine(work, args.rounds, args.warm_up)
    split_rows = cut_or_not(work, args.split_rounds)
    result = {
        "command": ("python -m benchmarks.embeddings " + " ".join(argv or sys.argv[1:])).strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine_record(),
        "model": MODEL,
        "summary": summarise(part1, split_rows),
        "part1": part1,
        # Part 1 taken from an earlier run (where it was measured), when it was.
        "part1_measured": {k: earlier[k] for k in ("date", "command")}
        | {"commit": earlier["machine"]["commit"]}
        if earlier
        else None,
        "cut_or_not": split_rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embeddings.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "embeddings.md").write_text(markdown(result))
    plot(result, args.out / "embeddings.png")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
