"""Does the what-if (``pdserve plan``) predict what a real sim cluster does?

For each fleet given, the same trace window runs twice:
- **predicted**: the fleet replay on simulated time (sim/fleet_replay.py), as the
  what-if runs it;
- **measured**: a real sim cluster of that shape (``pdserve up`` with the same timing
  profile: router, agents, sim servers, KV events, HTTP and SSE), loaded by
  ``pdserve bench`` replaying the trace at its own times.
Both count the requests meeting the TTFT and ITL SLOs (bench: TTFT and TPOT). Writes
``planner_whatif.{json,md,png}``. The goal: predicted goodput within 15% of measured.

    python -m benchmarks.planner_whatif --fleets 1:1,2:1 [--requests 400 --length-scale 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from contracts.machine import machine_record
from loadgen.traces import DEFAULT_TRACE, TRACE_BLOCK_TOKENS, read_trace
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama
from sim.fleet_replay import FleetSize, replay, slo_outcome
from sim.profile import load_profile


def predicted(args: argparse.Namespace, fleet: FleetSize) -> dict:
    trace = read_trace(args.trace, limit=args.requests, length_scale=args.length_scale)
    result = replay(load_profile(args.profile), trace, start=fleet,
                    until_s=trace[-1].send_at_s + 1,
                    block_tokens=max(1, int(TRACE_BLOCK_TOKENS / args.length_scale)))  # fmt: skip
    outcome = slo_outcome(result, ttft_s=args.ttft_slo_s, itl_s=args.itl_slo_s)
    # As pdserve bench counts it: from the first send to the last answer's end.
    ends = [s.at_s + s.ttft_s + s.itl_s * max(0, s.output_tokens - 1) for s in result.served]
    duration_s = max(ends) - trace[0].send_at_s
    return {
        "requests": outcome.requests, "met": outcome.met,
        "attainment": round(outcome.share(outcome.met), 4),
        "goodput_per_s": round(outcome.met / duration_s, 4), "duration_s": round(duration_s, 1),
    }  # fmt: skip


def measured(args: argparse.Namespace, fleet: FleetSize, run_dir: Path) -> dict:
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=tiny_llama.SERVED_NAME,
        prefill=fleet.prefill, decode=fleet.decode, port=port, run_dir=run_dir / "cluster",
        ready_timeout_s=120, engine="sim", sim_profile=args.profile,
        max_model_len=args.max_model_len,
    )  # fmt: skip
    cluster = LocalCluster(plan)
    out = run_dir / "bench"
    try:
        cluster.start()
        command = [
            sys.executable, "-m", "cli.main", "bench", "--url", cluster.router_url,
            "--model", tiny_llama.SERVED_NAME, "--tokenizer", "tiny", "--label", "whatif",
            "--dataset", "mooncake", "--trace", str(args.trace), "--arrival", "trace",
            "--num-requests", str(args.requests), "--length-scale", str(args.length_scale),
            "--output-scale", str(args.length_scale), "--duration-s", "3600",
            "--slo-ttft-ms", str(args.ttft_slo_s * 1000),
            "--slo-tpot-ms", str(args.itl_slo_s * 1000), "--out", str(out),
        ]  # fmt: skip
        subprocess.run(command, check=True)
    finally:
        cluster.stop()
    (written,) = out.glob("*.json")  # one run: the trace's own times
    summary = json.loads(written.read_text())["summary"]
    return {
        "requests": summary["requests"], "failed": summary["failed"],
        "attainment": round(summary["slo_attainment"], 4),
        "goodput_per_s": round(summary["goodput"], 4),
        "duration_s": round(summary["duration_s"], 1),
    }  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--length-scale", type=float, default=8.0)
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--ttft-slo-s", type=float, default=0.25)
    parser.add_argument("--itl-slo-s", type=float, default=0.04)
    parser.add_argument("--fleets", default="1:1,2:1", help="PREFILL:DECODE,...")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_record()  # at the start: the commit whose code runs
    rows = []
    for item in args.fleets.split(","):
        prefill, decode = (int(n) for n in item.split(":"))
        fleet = FleetSize(prefill, decode)
        with tempfile.TemporaryDirectory(prefix="whatif-") as tmp:
            real = measured(args, fleet, Path(tmp))
        guess = predicted(args, fleet)
        ratio = guess["goodput_per_s"] / real["goodput_per_s"] if real["goodput_per_s"] else None
        rows.append({"fleet": f"{prefill}P+{decode}D", "predicted": guess, "measured": real,
                     "goodput_ratio": ratio and round(ratio, 3)})  # fmt: skip
        print(json.dumps(rows[-1]), file=sys.stderr)
    report = {"machine": machine,
              "command": "python -m benchmarks.planner_whatif " + " ".join(argv or sys.argv[1:]),
              "settings": vars(args) | {"trace": str(args.trace), "out": str(args.out)},
              "fleets": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "planner_whatif.json").write_text(json.dumps(report, indent=1))
    (args.out / "planner_whatif.md").write_text(markdown(report))
    plot(report, args.out / "planner_whatif.png")
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    lines = [
        "# The what-if's replay against a real sim cluster", "",
        f"`{report['command']}` at {report['machine'].get('commit')}", "",
        "| fleet | predicted attainment | measured | predicted goodput/s | measured | ratio |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for row in report["fleets"]:
        p, m = row["predicted"], row["measured"]
        lines.append(
            f"| {row['fleet']} | {p['attainment']:.1%} | {m['attainment']:.1%} | "
            f"{p['goodput_per_s']} | {m['goodput_per_s']} | {row['goodput_ratio']} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fleets = [row["fleet"] for row in report["fleets"]]
    x = range(len(fleets))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([i - 0.2 for i in x], [r["predicted"]["goodput_per_s"] for r in report["fleets"]],
           width=0.4, label="what-if (fleet replay)")  # fmt: skip
    ax.bar([i + 0.2 for i in x], [r["measured"]["goodput_per_s"] for r in report["fleets"]],
           width=0.4, label="real sim cluster")  # fmt: skip
    ax.set_xticks(list(x), fleets)
    ax.set_ylabel("goodput (requests meeting both SLOs per s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
