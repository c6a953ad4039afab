"""A real client against the router: ``vllm bench serve`` and ``pdserve bench``, same workload.

Starts ``make run``'s shape on the tiny model (router, 1 prefill, 1 decode), then runs
vLLM's own benchmark client and ``pdserve bench`` (``bench_clients.py``) against the
router's chat endpoint,
alternating A B A B so drift on this shared box hits both alike. Same workload for
both: random prompts of INPUT_LEN tokens, OUTPUT_LEN output tokens (ignore_eos,
temperature 0), NUM_PROMPTS requests, MAX_CONCURRENCY in flight, no rate limit.
Reported: failures (must be 0 in both), and TTFT/TPOT means and medians side by side.
As a referee for TTFT, each run also records the router's own mean TTFT over that run
(its ``pdserve_time_to_first_token_seconds`` sum/count, arrival to first byte): a
client whose mean is far from the router's is measuring something else.

    python -m benchmarks.real_client [--rounds 2]
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
from contracts.machine import machine_record
from loadgen.prometheus_text import scrape, total
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama

INPUT_LEN, OUTPUT_LEN, NUM_PROMPTS, MAX_CONCURRENCY = 128, 32, 48, 4
METRICS = (
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "router_mean_ttft_ms",
)


def vllm_bench(router_url: str, model_path: Path, out: Path, seed: int) -> dict:
    argv = [
        "--backend", "openai-chat", "--base-url", router_url,
        "--endpoint", "/v1/chat/completions", "--model", tiny_llama.SERVED_NAME,
        "--tokenizer", str(model_path), "--dataset-name", "random",
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", str(MAX_CONCURRENCY),
        "--request-rate", "inf", "--ignore-eos", "--temperature", "0", "--seed", str(seed),
        "--disable-tqdm",
    ]  # fmt: skip
    result = vllm_bench_serve(argv, out / f"vllm_bench_{seed}.log")
    return {"client": "vllm bench serve", "completed": result.get("completed"),
            "failed": result.get("failed", NUM_PROMPTS - result.get("completed", 0)),
            **{m: result.get(m) for m in METRICS}}  # fmt: skip


def pdserve_bench_chat(router_url: str, out: Path, seed: int) -> dict:
    argv = [
        "--url", router_url, "--model", tiny_llama.SERVED_NAME, "--endpoint", "chat",
        "--tokenizer", "tiny", "--dataset", "random", "--input-len", str(INPUT_LEN),
        "--output-len", str(OUTPUT_LEN), "--range-ratio", "0", "--num-requests",
        str(NUM_PROMPTS), "--rates", "1000", "--max-concurrency", str(MAX_CONCURRENCY),
        "--seed", str(seed),
    ]  # fmt: skip
    run = pdserve_bench(argv, out / f"pdserve_bench_{seed}", out / f"pdserve_bench_{seed}.log")
    m = run["summary"]
    ttft, tpot = m["ttft_ms"], m["tpot_ms"]
    return {"client": "pdserve bench", "completed": m["succeeded"], "failed": m["failed"],
            "mean_ttft_ms": ttft["mean"], "median_ttft_ms": ttft["p50"],
            "mean_tpot_ms": tpot["mean"], "median_tpot_ms": tpot["p50"]}  # fmt: skip


def router_ttft(router_url: str) -> tuple[float, float]:
    """(sum of seconds, count) of the router's TTFT histogram so far."""
    samples = scrape(router_url + "/metrics")
    name = "pdserve_time_to_first_token_seconds"
    return total(samples, name + "_sum"), total(samples, name + "_count")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pdserve-real-client-"))
    (port,) = free_ports(1)
    plan = ClusterPlan(model_path=tiny_llama.ensure(), served_name=tiny_llama.SERVED_NAME,
                       prefill=1, decode=1, port=port, run_dir=work / "cluster")  # fmt: skip
    cluster = LocalCluster(plan, say=lambda m: print(f"bench: {m}", flush=True))
    runs = []
    try:
        cluster.start()
        for round_index in range(args.rounds):
            for client in ("vllm", "pdserve"):
                before = router_ttft(cluster.router_url)
                if client == "vllm":
                    run = vllm_bench(cluster.router_url, plan.model_path, work, round_index)
                else:
                    run = pdserve_bench_chat(cluster.router_url, work, round_index)
                after = router_ttft(cluster.router_url)
                run["router_mean_ttft_ms"] = (
                    1000 * (after[0] - before[0]) / max(1, after[1] - before[1])
                )
                print(f"bench: {json.dumps(run)}", flush=True)
                runs.append(run)
    finally:
        cluster.stop()
    summary = {}
    for client in ("vllm bench serve", "pdserve bench"):
        mine = [r for r in runs if r["client"] == client]
        summary[client] = {"failed": sum(r["failed"] for r in mine)} | {
            m: statistics.fmean(r[m] for r in mine) for m in METRICS
        }
    ratios = {m: summary["pdserve bench"][m] / summary["vllm bench serve"][m] for m in METRICS}
    report = {
        "machine": machine_record(),
        "command": ("python -m benchmarks.real_client " + " ".join(argv or sys.argv[1:])).strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "workload": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN,
                     "num_prompts": NUM_PROMPTS, "max_concurrency": MAX_CONCURRENCY},
        "runs": runs, "summary": summary, "pdserve_over_vllm": ratios,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "real_client.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"summary": summary, "pdserve_over_vllm": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
