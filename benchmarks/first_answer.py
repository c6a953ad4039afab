"""How soon ``make run``'s cluster answers: from "ready" to the first streamed token.

Starts ``pdserve up`` exactly as ``make run`` does (SmolLM2, 1 prefill + 1 decode),
waits for its "ready" line, then at once sends the chat request the launcher prints
and times the first token and the end of the stream. A few more requests follow, so
the first can be told from the steady state. The cluster is stopped at the end.

    python -m benchmarks.first_answer [--model smollm2] [--requests 5]
"""

from __future__ import annotations

import argparse
import json
import signal
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


async def streamed_chat(url: str, model: str) -> dict:
    """Seconds to the first content token and to [DONE] of one streamed chat."""
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}],
            "stream": True, "max_tokens": 16}  # fmt: skip
    started = time.perf_counter()
    first_s, text = None, ""
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
                delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                if delta and first_s is None:
                    first_s = time.perf_counter() - started
                text += delta
    return {"status": 200, "ttft_s": first_s, "e2e_s": time.perf_counter() - started,
            "text": text}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="as make run's MODEL")
    parser.add_argument("--requests", type=int, default=5, help="requests after the first")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    (port,) = free_ports(1)
    run_dir = Path(tempfile.mkdtemp(prefix="pdserve-first-answer-"))
    started = time.monotonic()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up", "--model", args.model, "--port", str(port),
         "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        model = None
        for line in launcher.stdout:
            print(line, end="", flush=True)
            if '"model": "' in line:
                model = line.split('"model": "')[1].split('"')[0]
                break
        if model is None:
            raise RuntimeError("pdserve up ended before it was ready")
        ready_s = time.monotonic() - started
        url = f"http://127.0.0.1:{port}"
        answers = [asyncio.run(streamed_chat(url, model)) for _ in range(1 + args.requests)]
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=180)
    first = answers[0]
    result = {
        "command": ("python -m benchmarks.first_answer " + " ".join(argv or sys.argv[1:])).strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": model,
        "machine": machine_record(),
        "ready_after_start_s": round(ready_s, 1),
        "first_answer": first,
        "later_answers": answers[1:],
        # "The first answer arrives": its first token, as a person watching curl sees it.
        "goal": "first answer's first token within 2 s of ready",
        "met": first.get("status") == 200 and first["ttft_s"] <= 2.0,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_answer.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "later_answers"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
