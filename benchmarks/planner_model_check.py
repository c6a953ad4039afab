"""Does the planner's model predict what the fleet replay measures, on windows of a real
trace it was not designed on?

For each window of the trace (``--windows``, 400 requests each, their own timestamps)
and each fleet, three numbers: the attainment the fleet replay measures (sim engines on
simulated time, sim/fleet_replay.py), and the model's (router/fleet/planner_model.py)
two ways:
- **no clumps**: the arrivals' burstiness as one ``ca^2`` over every gap, as the model
  had it before (each request waits for others only through the queue's exponential tail);
- **clumps**: the requests that arrive at once (the Mooncake trace rounds its timestamps
  to about 3 s) grouped into clumps, whose requests wait for each other a round of
  service per ``P`` ahead of them, and ``ca^2`` over the gaps between clumps.

The clump term was designed on the trace's first 400 requests (lengths / 8, TTFT
0.25 s: the model said 87% for 1P+1D where the replay measured 39%); the default
windows leave those out. Writes ``planner_model_check.{json,md,png}``.

    python -m benchmarks.planner_model_check [--length-scale 8 --ttft-slo-s 0.25]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from contracts.machine import machine_record
from loadgen.traces import DEFAULT_TRACE, TRACE_BLOCK_TOKENS, TraceRequest, read_trace
from router.fleet.planner_model import (
    Fleet,
    Load,
    Slo,
    arrival_clumps,
    arrival_cv2,
    predict,
    speeds_from_profile,
)  # fmt: skip
from sim.fleet_replay import FleetSize, replay, slo_outcome
from sim.profile import load_profile


def loads(window: list[TraceRequest]) -> tuple[Load, Load, int]:
    """(without clumps, with clumps, the largest clump) of one window."""
    times = sorted(r.send_at_s for r in window)
    rate = len(window) / (times[-1] - times[0] or 1.0)
    lengths = tuple((r.input_tokens, r.output_tokens) for r in window)
    clumps, between = arrival_clumps(times)
    plain = Load(rate_per_s=rate, lengths=lengths, prefix_hit=0.0, arrival_cv2=arrival_cv2(times))
    clumped = replace(plain, arrival_cv2=between, clump_sizes=clumps)
    return plain, clumped, max(clumps)


def check(args: argparse.Namespace) -> list[dict]:
    profile = load_profile(args.profile)
    speeds = speeds_from_profile(asdict(profile))
    slo = Slo(ttft_s=args.ttft_slo_s, itl_s=args.itl_slo_s)
    trace = read_trace(args.trace, length_scale=args.length_scale,
                       limit=max(args.windows) + args.requests)  # fmt: skip
    rows = []
    block_tokens = max(1, int(TRACE_BLOCK_TOKENS / args.length_scale))
    for start in args.windows:
        window = trace[start : start + args.requests]
        first = window[0].send_at_s
        window = [replace(r, send_at_s=r.send_at_s - first) for r in window]
        plain, clumped, largest = loads(window)
        for prefill in args.prefill:
            fleet = Fleet(prefill=prefill, decode=1)
            result = replay(profile, window, start=FleetSize(prefill, 1),
                            until_s=window[-1].send_at_s + 1,
                            block_tokens=block_tokens)  # fmt: skip
            outcome = slo_outcome(result, ttft_s=slo.ttft_s, itl_s=slo.itl_s)
            row = {
                "window_start": start, "fleet": str(fleet), "largest_clump": largest,
                "replay": round(outcome.share(outcome.met), 4),
                "model_no_clumps": round(predict(fleet, plain, speeds, slo, 0.0).attainment, 4),
                "model_clumps": round(predict(fleet, clumped, speeds, slo, 0.0).attainment, 4),
            }  # fmt: skip
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def errors(rows: list[dict]) -> dict:
    def mean_abs(key: str) -> float:
        return round(sum(abs(r[key] - r["replay"]) for r in rows) / len(rows), 4)

    def worst(key: str) -> float:
        return round(max(abs(r[key] - r["replay"]) for r in rows), 4)

    return {
        "pairs": len(rows),
        "mean_abs_error": {k: mean_abs(k) for k in ("model_no_clumps", "model_clumps")},
        "worst_abs_error": {k: worst(k) for k in ("model_no_clumps", "model_clumps")},
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 6))
    for key, marker, label in (("model_no_clumps", "x", "model, no clumps"),
                               ("model_clumps", "o", "model, clumps")):  # fmt: skip
        axis.scatter([r["replay"] for r in rows], [r[key] for r in rows], marker=marker,
                     label=label)  # fmt: skip
    axis.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
    axis.set_xlabel("attainment, fleet replay")
    axis.set_ylabel("attainment, model")
    axis.set_title("The planner's model against the replay (held-out windows)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def markdown(report: dict) -> str:
    error = report["errors"]
    lines = [
        "# The planner's model against the fleet replay (held-out trace windows)", "",
        f"`{report['command']}` at {report['machine']['commit'][:12]}; "
        f"{report['machine']['cpu_model']}, {report['machine']['cores']} cores.", "",
        f"Mean |model - replay| over {error['pairs']} (window, fleet) pairs: "
        f"**{error['mean_abs_error']['model_no_clumps']:.1%}** without clumps, "
        f"**{error['mean_abs_error']['model_clumps']:.1%}** with them (worst "
        f"{error['worst_abs_error']['model_no_clumps']:.1%} and "
        f"{error['worst_abs_error']['model_clumps']:.1%}).", "",
        "| window | fleet | largest clump | replay | model, no clumps | model, clumps |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in report["rows"]:
        lines.append(f"| {r['window_start']}+{report['settings']['requests']} | {r['fleet']} | "
                     f"{r['largest_clump']} | {r['replay']:.1%} | {r['model_no_clumps']:.1%} | "
                     f"{r['model_clumps']:.1%} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--length-scale", type=float, default=8.0)
    parser.add_argument("--ttft-slo-s", type=float, default=0.25)
    parser.add_argument("--itl-slo-s", type=float, default=0.04)
    parser.add_argument("--requests", type=int, default=400)
    numbers = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    parser.add_argument("--windows", type=numbers, default=[400, 1200, 2400, 3200],
                        help="first request of each window")  # fmt: skip
    parser.add_argument("--prefill", type=numbers, default=[1, 2, 3, 4, 6],
                        help="prefill workers (one decode)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_record()
    rows = check(args)
    report = {
        "machine": machine,
        "command": "python -m benchmarks.planner_model_check " + " ".join(argv or sys.argv[1:]),
        "settings": vars(args) | {"out": str(args.out), "trace": str(args.trace)},
        "rows": rows,
        "errors": errors(rows),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "planner_model_check"
    plot(rows, stem.with_suffix(".png"))
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    stem.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
