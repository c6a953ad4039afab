"""How soon ``make run``'s cluster answers: from "ready" to the first streamed token.

Starts ``pdserve up`` exactly as ``make run`` does (SmolLM2, 1 prefill + 1 decode),
waits for its "ready" line, then at once sends the chat request the launcher prints
and times the first token and the end of the 10-token answer. A few more requests
follow, so the first can be told from the steady state, then three ~1,000-token prompts
(each must get a 200 within the router's default TTFT SLO). The cluster is stopped at
the end. The result records the machine, the dtype line, and "ready" both from the
launch and from the engines' start (model conversion excluded).

    python -m benchmarks.first_answer [--model smollm2] [--requests 5] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from contracts.machine import machine_record
from localrun.ports import free_ports

READY = "ready: OpenAI API at"
QUESTION = "What is the capital of France?"
ANSWER_TOKENS = 10  # issue 31's goal: TTFT <= 0.5 s, the whole 10-token answer < 1 s
LONG_PROMPT_TOKENS = 1000  # ... and a 1,000-token prompt gets a 200 within the default SLO
_SENTENCE = ("The river carries water from the northern hills to the old market town, "
             "where people meet at the stone bridge every morning. ")  # fmt: skip


def long_question(tokens: int = LONG_PROMPT_TOKENS) -> str:
    """About ``tokens`` tokens of plain prose (~24 per sentence in SmolLM2's tokenizer),
    with a question at the end; the answer's usage says how many it was exactly. A nonce
    first: each is a fresh prefill, never a prefix-cache hit on the one before."""
    nonce = secrets.token_hex(4)
    return f"Note {nonce}. " + _SENTENCE * round(tokens / 24) + "Where do the people meet?"


async def streamed_chat(url: str, model: str, content: str = QUESTION) -> dict:
    """Seconds to the first content token and to [DONE] of one streamed chat."""
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "stream": True, "max_tokens": ANSWER_TOKENS,
            "stream_options": {"include_usage": True}}  # fmt: skip
    started = time.perf_counter()
    first_s, text, usage = None, "", None
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url + "/v1/chat/completions", json=body) as response,
    ):
        if response.status != 200:
            return {"status": response.status, "error": (await response.text())[:300]}
        async for raw in response.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                break
            if line.startswith("data: "):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                delta = (chunk["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                if delta and first_s is None:
                    first_s = time.perf_counter() - started
                text += delta
    return {"status": 200, "ttft_s": first_s, "e2e_s": time.perf_counter() - started,
            "usage": usage, "text": text}  # fmt: skip


def start_cluster(args: argparse.Namespace, port: int) -> tuple[subprocess.Popen, dict]:
    """``pdserve up`` as ``make run`` runs it; returns once it printed "ready", with the
    times of its lines that matter (seconds from the launch) and its dtype line."""
    run_dir = Path(tempfile.mkdtemp(prefix="pdserve-first-answer-"))
    command = [sys.executable, "-m", "cli.main", "up", "--model", args.model,
               "--port", str(port), "--run-dir", str(run_dir)]  # fmt: skip
    if args.dtype:
        command += ["--dtype", args.dtype]
    started = time.monotonic()
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip
    seen: dict = {"run_dir": str(run_dir)}
    for line in launcher.stdout:
        print(line, end="", flush=True)
        if "pdserve: dtype " in line:
            seen["dtype_line"] = line.strip().removeprefix("pdserve: ")
        if "[2/3]" in line:  # the engines start: the model is converted by now
            seen["engines_started_s"] = time.monotonic() - started
        if '"model": "' in line:
            seen["model"] = line.split('"model": "')[1].split('"')[0]
            seen["ready_s"] = time.monotonic() - started
            return launcher, seen
    raise RuntimeError("pdserve up ended before it was ready")


def main(argv: list[str] | None = None) -> int:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="as make run's MODEL")
    parser.add_argument("--requests", type=int, default=5, help="requests after the first")
    parser.add_argument("--dtype", default=None, help="pdserve up's --dtype (default: its rule)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    (port,) = free_ports(1)
    launcher, seen = start_cluster(args, port)
    try:
        url, model = f"http://127.0.0.1:{port}", seen["model"]
        answers = [asyncio.run(streamed_chat(url, model)) for _ in range(1 + args.requests)]
        long = [asyncio.run(streamed_chat(url, model, long_question())) for _ in range(3)]
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=180)
    first = answers[0]
    later = [a for a in answers[1:] if a.get("status") == 200]
    result = {
        "command": ("python -m benchmarks.first_answer " + " ".join(argv or sys.argv[1:])).strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": model,
        "machine": machine_record(),
        "dtype": seen.get("dtype_line"),
        # Others' load on the box at the end (1-, 5-, 15-minute averages): a shared box
        # slows both engines' start and answers.
        "load_average": [round(load, 2) for load in os.getloadavg()],
        "ready_after_start_s": round(seen["ready_s"], 1),
        # Issue 31's measure: from the engines' start to "ready", conversion excluded.
        "ready_after_engines_start_s": round(seen["ready_s"] - seen["engines_started_s"], 1),
        "first_answer": first,
        "later_answers": answers[1:],
        "later_ttft_s_median": statistics.median(a["ttft_s"] for a in later) if later else None,
        "later_e2e_s_median": statistics.median(a["e2e_s"] for a in later) if later else None,
        "long_prompt_answers": long,
        # "The first answer arrives": its first token, as a person watching curl sees it.
        "goal": "first answer's first token within 2 s of ready",
        "met": first.get("status") == 200 and first["ttft_s"] <= 2.0,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"first_answer_{args.dtype}.json" if args.dtype else "first_answer.json"
    (out / name).write_text(json.dumps(result, indent=2))
    shown = ("later_answers", "long_prompt_answers")
    print(json.dumps({k: v for k, v in result.items() if k not in shown}, indent=2))
    for answer in long:
        print(json.dumps({k: v for k, v in answer.items() if k != "text"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
