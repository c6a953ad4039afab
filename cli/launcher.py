"""``pdserve up``: a whole local cluster in one command, torn down by one Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from agent.engine_dtype import DTYPE_ENV, DTYPES, choose_dtype
from agent.engine_spec import detect_device
from contracts.machine import read_cpu
from localrun.cluster import ClusterPlan, LocalCluster, VersionWorkers
from modelstore.known import resolve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model folder")
    parser.add_argument("--prefill", type=int, default=1, help="prefill workers")
    parser.add_argument("--decode", type=int, default=1, help="decode workers")
    parser.add_argument("--colocated", type=int, default=0, help="colocated (no P/D) workers")
    parser.add_argument(
        "--colocated-name",
        default=None,
        help="served model name of colocated workers (default: the model's), "
        "to offer the model with and without P/D side by side",
    )
    parser.add_argument("--host", default="127.0.0.1", help="router bind address")
    parser.add_argument("--port", type=int, default=8000, help="router port")
    parser.add_argument(
        "--run-dir", default=None, help="logs and cluster.json (default .pdserve/runs/TS)"
    )
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="KV cache per CPU engine")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help=f"every engine's dtype (default: ${DTYPE_ENV}, else float32 on a "
                        "CPU without native bf16, bfloat16 on one with it, the model's own "
                        "on GPU)")  # fmt: skip
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    parser.add_argument("--drain-timeout-s", type=float, default=20.0,
                        help="on a stop, how long in-flight requests get to finish (a second "
                        "Ctrl-C or SIGTERM stops at once)")  # fmt: skip
    parser.add_argument("--engine", choices=["vllm", "sim"], default="vllm",
                        help="sim: GPU-free simulated engines with the same protocol")  # fmt: skip
    parser.add_argument("--sim-profile", default="tiny-cpu", help="timing profile for sims")
    parser.add_argument("--stream-interval", type=int, default=None,
                        help="output tokens per streamed chunk (vLLM's --stream-interval, "
                        "default 1): less CPU per token, tokens in bursts")  # fmt: skip
    parser.add_argument(
        "--model-version",
        default=None,
        help="the registered version the workers above serve (model registry)",
    )
    parser.add_argument("--embed", type=int, default=0,
                        help="embedding workers (vLLM's pooling runner) for --embed-model, "
                        "served at /v1/embeddings")  # fmt: skip
    parser.add_argument(
        "--embed-model",
        default="minilm",
        help="minilm (all-MiniLM-L6-v2), or an embedding model folder",
    )
    parser.add_argument("--version", action="append", default=[], metavar="VERSION=FOLDER",
                        help="also one colocated worker serving another version of the model "
                        "from FOLDER (a canary or shadow); repeatable")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir or Path(".pdserve") / "runs" / time.strftime("%Y%m%d-%H%M%S"))
    _say(f"run folder: {run_dir} (one log per process)")
    embed_path, embed_name = resolve(args.embed_model) if args.embed else (None, None)
    generates = args.prefill + args.decode + args.colocated > 0 or bool(args.version)
    # An embedding-only cluster has no chat model to prepare (a minute, for nothing).
    model_path, served_name = (
        resolve(args.model) if generates or embed_path is None else (embed_path, embed_name)
    )
    try:
        dtype = _dtype(args)
        plan = ClusterPlan(
            model_path=model_path,
            served_name=served_name,
            colocated_served_name=args.colocated_name,
            prefill=args.prefill,
            decode=args.decode,
            colocated=args.colocated,
            host=args.host,
            port=args.port,
            run_dir=run_dir,
            kv_cache_gib=args.kv_cache_gib,
            max_model_len=args.max_model_len,
            ready_timeout_s=args.ready_timeout_s,
            drain_timeout_s=args.drain_timeout_s,
            engine=args.engine,
            sim_profile=args.sim_profile,
            stream_interval=args.stream_interval,
            dtype=dtype,
            model_version=args.model_version,
            versions=tuple(_other_version(spec) for spec in args.version),
            embed=args.embed,
            embed_model_path=embed_path,
            embed_served_name=embed_name,
        )
    except ValueError as error:
        raise SystemExit(f"pdserve up: {error}") from None
    cluster = LocalCluster(plan, say=_say)
    stopping = _stop_on_signals(cluster)
    try:
        cluster.start(stopping)
        if not stopping():
            _say_ready(cluster.router_url, served_name if generates else None, embed_name)
        while not stopping() and cluster.router_alive():
            time.sleep(0.2)
        return 0 if stopping() else 1
    except RuntimeError as error:
        _say(f"failed: {error}")
        return 1
    finally:
        _say("stopping: agents drain and stop their engines, then the router")
        cluster.stop()
        _say("stopped; no process left")


def _dtype(args: argparse.Namespace) -> str | None:
    """Chosen once here, so every engine runs the same; said in one line."""
    if args.engine == "sim":
        return None
    choice = choose_dtype(device=detect_device(), cpu=read_cpu(), requested=args.dtype,
                          setting=os.environ.get(DTYPE_ENV))  # fmt: skip
    _say(choice.line())
    return choice.dtype


def _stop_on_signals(cluster: LocalCluster) -> Callable[[], bool]:
    """SIGINT or SIGTERM starts the orderly stop; a second one means stop now: every
    process of the cluster is SIGKILLed at once. Returns "has a stop been asked for?"."""
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) > 1:
            # os.write, not print: the handler may interrupt a print on this stream.
            os.write(1, b"pdserve: second signal: killing every process now\n")
            cluster.kill()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return lambda: bool(received)


def _other_version(spec: str) -> VersionWorkers:
    version, _, folder = spec.partition("=")
    if not version or not folder:
        raise ValueError(f"--version wants VERSION=FOLDER, got {spec!r}")
    return VersionWorkers(version=version, model_path=resolve(folder)[0])


def _say(message: str) -> None:
    print(f"pdserve: {message}", flush=True)


def _say_ready(url: str, model: str | None, embed_model: str | None) -> None:
    """The ready line, and a curl for each kind of model served (chat, embeddings)."""
    _say(f"ready: OpenAI API at {url}/v1  (Ctrl-C stops everything)")
    if model:
        body = json.dumps({
            "model": model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "stream": True,
        })  # fmt: skip
        print(f"\n  curl -N {url}/v1/chat/completions -H 'Content-Type: application/json' "
              f"-d '{body}'\n", flush=True)  # fmt: skip
    if embed_model:
        embed = json.dumps({"model": embed_model, "input": ["The capital of France", "Paris"]})
        print(f"  curl {url}/v1/embeddings -H 'Content-Type: application/json' -d '{embed}'\n",
              flush=True)  # fmt: skip
