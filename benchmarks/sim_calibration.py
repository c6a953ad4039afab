"""Is the simulator's timing within 25% of real vLLM's? Measured side by side in one run.

For each model (the tiny random Llama, SmolLM2-135M):
1. start one real vLLM (CPU build, all cores), run the calibration sweep of
   ``pdserve sim calibrate`` and fit a profile, then run the check workload;
2. start a sim with the fitted profile, and one with the shipped profile
   (sim/profiles/NAME.json), and run the same check workload on each.
The check workload is not the sweep: closed-loop, CONCURRENCY streams, prompt
lengths cycling through CHECK_LENGTHS, CHECK_TOKENS output tokens, fresh prompts.
Reported: TTFT and TPOT (mean, p50) per engine, and sim/real ratios.

    python -m benchmarks.sim_calibration [--models tiny smollm2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp

from agent.engine_spec import EngineSpec
from contracts.machine import machine_record
from contracts.tokenization import load_tokenizer
from loadgen.calibration import fit_profile, fresh_prompt, measure_sweep, write_profile
from loadgen.client import RequestResult, stream_request
from localrun.engine_run import running_engine
from localrun.ports import free_ports
from localrun.sim_engine import sim_facts
from modelstore.known import resolve
from sim.profile import PROFILE_DIR, load_profile

SHIPPED_PROFILE = {"tiny": "tiny-cpu", "smollm2": "smollm2-cpu"}
CONCURRENCY = 4
CHECK_LENGTHS = (128, 512, 1024, 256)
CHECK_TOKENS = 32
CHECK_REQUESTS = 48  # 12 of each length: percentiles that hold still between runs
TOLERANCE = 0.25


async def check_workload(url: str, model: str, vocab_size: int) -> list[RequestResult]:
    rng = random.Random(1)
    prompts = [fresh_prompt(rng, CHECK_LENGTHS[i % len(CHECK_LENGTHS)], vocab_size)
               for i in range(CHECK_REQUESTS)]  # fmt: skip
    queue = list(reversed(prompts))
    results: list[RequestResult] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        warm = {"model": model, "prompt": fresh_prompt(rng, 16, vocab_size), "max_tokens": 2}
        await stream_request(session, url + "/v1/completions", warm)

        async def worker() -> None:
            while queue:
                body = {"model": model, "prompt": queue.pop(), "max_tokens": CHECK_TOKENS,
                        "ignore_eos": True, "temperature": 0}  # fmt: skip
                results.append(await stream_request(session, url + "/v1/completions", body))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"check workload failed on {url}: {failed[:3]}")
    return results


def summarize(results: list[RequestResult]) -> dict[str, float]:
    ttft = [r.ttft_s * 1000 for r in results if r.ttft_s is not None]
    tpot = [r.tpot_s * 1000 for r in results if r.tpot_s is not None]
    return {
        "ttft_mean_ms": statistics.fmean(ttft),
        "ttft_p50_ms": statistics.median(ttft),
        "tpot_mean_ms": statistics.fmean(tpot),
        "tpot_p50_ms": statistics.median(tpot),
    }


def run_model(name: str, work: Path) -> dict:
    model_path, served = resolve(name)
    vocab = load_tokenizer(str(model_path)).vocab_size
    shipped = load_profile(SHIPPED_PROFILE[name])
    port, sim_port = free_ports(2)
    spec = EngineSpec(model_path=str(model_path), served_model_name=served, port=port,
                      cores="0-1", max_model_len=4096)  # fmt: skip
    print(f"[{name}] real vLLM: starting (log {work / f'{name}-vllm.log'})", flush=True)
    with running_engine(spec, work / f"{name}-vllm.log") as url:
        print(f"[{name}] real vLLM: calibration sweep", flush=True)
        sweep = asyncio.run(measure_sweep(url, served, vocab_size=vocab, repeats=5))
        print(f"[{name}] real vLLM: check workload", flush=True)
        real = summarize(asyncio.run(check_workload(url, served, vocab)))
    fitted = fit_profile(sweep, shipped, name=f"{shipped.name}-fitted",
                         source=f"fitted in this benchmark run, {time.strftime('%F')}")  # fmt: skip
    fitted_path = work / f"{fitted.name}.json"
    write_profile(fitted, sweep, fitted_path)
    rows = {"real_vllm": real}
    for label, profile in (("sim_fitted", str(fitted_path)), ("sim_shipped", shipped.name)):
        sim = EngineSpec(model_path=str(model_path), served_model_name=served, port=sim_port,
                         engine="sim", sim_profile=profile, sim_facts=sim_facts(profile),
                         max_model_len=4096)  # fmt: skip
        print(f"[{name}] {label}: check workload", flush=True)
        with running_engine(sim, work / f"{name}-{label}.log", ready_timeout_s=60) as url:
            rows[label] = summarize(asyncio.run(check_workload(url, served, vocab)))
    ratios = {
        label: {key: rows[label][key] / real[key] for key in real}
        for label in ("sim_fitted", "sim_shipped")
    }
    return {
        "model": served,
        "rows": rows,
        "ratios_sim_over_real": ratios,
        "within_tolerance": {
            label: all(abs(r - 1) <= TOLERANCE for r in ratio.values())
            for label, ratio in ratios.items()
        },
        "fitted_profile": json.loads(fitted_path.read_text()),
        "sweep": asdict(sweep),
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    figure, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    labels = ("real_vllm", "sim_fitted", "sim_shipped")
    metrics = ("ttft_mean_ms", "ttft_p50_ms", "tpot_mean_ms", "tpot_p50_ms")
    for axis, result in zip(axes[0], models, strict=True):
        width = 0.27
        for offset, label in enumerate(labels):
            values = [result["rows"][label][m] for m in metrics]
            positions = [i + (offset - 1) * width for i in range(len(metrics))]
            axis.bar(positions, values, width, label=label)
        axis.set_xticks(range(len(metrics)), [m.replace("_ms", "") for m in metrics])
        axis.set_yscale("log")
        axis.set_ylabel("ms (log)")
        axis.set_title(f"{result['model']}: sim vs real vLLM (±25% goal)")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"],
                        choices=sorted(SHIPPED_PROFILE))  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pdserve-sim-calibration-"))
    report = {
        "machine": machine_record(),
        "command": "python -m benchmarks.sim_calibration " + " ".join(sys.argv[1:]),
        "date": time.strftime("%F %T"),
        "tolerance": TOLERANCE,
        "workload": {
            "concurrency": CONCURRENCY,
            "prompt_tokens": CHECK_LENGTHS,
            "output_tokens": CHECK_TOKENS,
            "requests": CHECK_REQUESTS,
        },
        "models": [run_model(name, work) for name in args.models],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim_calibration.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out / "sim_calibration.png")
    for result in report["models"]:
        for label, ratio in result["ratios_sim_over_real"].items():
            shown = ", ".join(f"{k.removesuffix('_ms')} {v:.2f}" for k, v in ratio.items())
            print(f"{result['model']:>24} {label:12s} sim/real: {shown}")
    print(f"wrote {args.out}/sim_calibration.json and .png; profiles fitted here: {work}")
    print(f"shipped profiles live in {PROFILE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
