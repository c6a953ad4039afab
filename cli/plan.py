"""``pdserve plan``: what-if a trace on fleets of every size, on the simulator.

    pdserve plan --trace T --slo ttft=2,itl=0.04 --budget 48 [--usd-per-worker-hour 3]

The planner's model (router/fleet/planner_model.py) names the smallest fleet it expects
to meet the SLO; the fleets around it (sizes from two below to three above, each at the
model's best split and one either side) are then replayed on the sim engines on
simulated time (sim/fleet_replay.py) over the trace; while none meets the target,
larger sizes follow, as long as the budget allows and goodput still grows. Printed:
each fleet's attainment (and the model's), goodput (requests meeting both SLOs per
second), $/hour and goodput per dollar; the frontier (no cheaper fleet has as much
goodput); and the recommendation: the cheapest fleet meeting the attainment target
within the budget, or, if none does, the one with the most goodput. ``plan.json`` and
``plan.png`` go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from loadgen.traces import DEFAULT_TRACE, TRACE_BLOCK_TOKENS, TraceRequest, read_trace
from router.fleet.planner_model import (
    Fleet,
    Load,
    Prices,
    Slo,
    Speeds,
    arrival_clumps,
    predict,
    speeds_from_profile,
)  # fmt: skip
from router.fleet.planner_service import slo_argument
from sim.fleet_replay import FleetSize, replay, slo_outcome
from sim.profile import load_profile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake-format trace")
    parser.add_argument("--slo", type=slo_argument, required=True,
                        help="ttft=SECONDS,itl=SECONDS[,attainment=0.95]")  # fmt: skip
    parser.add_argument("--budget", type=float, default=math.inf, help="$/hour for the fleet")
    parser.add_argument("--usd-per-worker-hour", type=float, default=3.0)
    parser.add_argument("--usd-per-decode-worker-hour", type=float, default=None,
                        help="a decode worker's, where it differs")  # fmt: skip
    parser.add_argument("--profile", default="llama3-8b-h100", help="the sim's timing profile")
    parser.add_argument("--speed", type=float, default=1.0, help="divide the trace's times")
    parser.add_argument("--length-scale", type=float, default=1.0,
                        help="divide the trace's lengths (and its 512-token blocks)")  # fmt: skip
    parser.add_argument("--limit", type=int, default=3000, help="replay the first N requests")
    parser.add_argument("--max-workers", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("plan"))


def candidates(model_pick: Fleet, slo: Slo, load: Load, speeds: Speeds,
               max_workers: int) -> list[Fleet]:  # fmt: skip
    """Sizes two below to three above the model's pick; at each, its best split and the
    splits either side."""
    out: list[Fleet] = []
    for total in range(
        max(2, model_pick.workers - 2), min(max_workers, model_pick.workers + 3) + 1
    ):
        splits = [Fleet(prefill=p, decode=total - p) for p in range(1, total)]
        best = max(splits, key=lambda f: predict(f, load, speeds, slo, 1.0).attainment)
        out += [f for f in splits if abs(f.prefill - best.prefill) <= 1]
    return out


def model_pick(slo: Slo, load: Load, speeds: Speeds, max_workers: int) -> Fleet:
    for total in range(2, max_workers + 1):
        for prefill in range(1, total):
            fleet = Fleet(prefill=prefill, decode=total - prefill)
            if predict(fleet, load, speeds, slo, 1.0).meets(slo):
                return fleet
    return Fleet(prefill=max_workers // 2, decode=max_workers - max_workers // 2)


def sweep(args: argparse.Namespace, requests: list[TraceRequest]) -> list[dict]:
    """Replay the model's candidates; then, while none meets the target, one size larger
    (around the best split replayed so far) as long as the budget allows and goodput
    still grows: the model guides where to look, the replays decide."""
    profile = load_profile(args.profile)
    duration_s = requests[-1].send_at_s - requests[0].send_at_s or 1.0
    clumps, between_clumps_cv2 = arrival_clumps(sorted(r.send_at_s for r in requests))
    load = Load(rate_per_s=len(requests) / duration_s, prefix_hit=0.0,
                lengths=tuple((r.input_tokens, r.output_tokens) for r in requests),
                arrival_cv2=between_clumps_cv2, clump_sizes=clumps)  # fmt: skip
    prices = Prices.by_role(args.usd_per_worker_hour, args.usd_per_decode_worker_hour)
    cheapest = min(prices.prefill, prices.decode)
    affordable = min(args.max_workers, int(args.budget // cheapest)
                     if math.isfinite(args.budget) and cheapest > 0
                     else args.max_workers)  # fmt: skip
    speeds = speeds_from_profile(asdict(profile))
    block_tokens = max(1, int(TRACE_BLOCK_TOKENS / args.length_scale))

    def run(fleet: Fleet) -> dict:
        result = replay(profile, requests, start=FleetSize(fleet.prefill, fleet.decode),
                        until_s=requests[-1].send_at_s + 1, block_tokens=block_tokens)  # fmt: skip
        outcome = slo_outcome(result, ttft_s=args.slo.ttft_s, itl_s=args.slo.itl_s)
        row = fleet_row(fleet, outcome.met, outcome.share(outcome.met), duration_s,
                        prices.of(fleet))  # fmt: skip
        row["model_attainment"] = round(predict(fleet, load, speeds, args.slo, 0.0).attainment, 4)
        line = f"{fleet}: {row['attainment']:.1%} attained (model {row['model_attainment']:.1%}), "
        print(line + f"{row['goodput_per_s']} good req/s, ${row['usd_per_hour']:.2f}/h",
              file=sys.stderr)  # fmt: skip
        return row

    pick = model_pick(args.slo, load, speeds, affordable)
    rows = [run(fleet) for fleet in candidates(pick, args.slo, load, speeds, affordable)]
    while not any(r["attainment"] >= args.slo.attainment for r in rows):
        best = max(rows, key=lambda r: (r["goodput_per_s"], -r["usd_per_hour"]))
        total = max(r["prefill"] + r["decode"] for r in rows) + 1
        if total > affordable or best["prefill"] + best["decode"] < total - 2:
            break  # over budget, or two sizes bought no goodput
        share = best["prefill"] / (best["prefill"] + best["decode"])
        centre = min(total - 1, max(1, round(share * total)))
        splits = sorted({max(1, centre - 1), centre, min(total - 1, centre + 1)})
        rows += [run(Fleet(prefill=p, decode=total - p)) for p in splits]
    return rows


def fleet_row(fleet: Fleet, met: int, attainment: float, duration_s: float,
              usd_per_hour: float) -> dict:  # fmt: skip
    goodput = met / duration_s
    return {
        "fleet": str(fleet), "prefill": fleet.prefill, "decode": fleet.decode,
        "attainment": round(attainment, 4), "goodput_per_s": round(goodput, 3),
        "usd_per_hour": usd_per_hour,
        "good_requests_per_usd": round(goodput * 3600 / usd_per_hour, 1),
    }  # fmt: skip


def frontier(rows: list[dict]) -> list[dict]:
    """Fleets no cheaper (or equally priced) fleet matches in goodput."""
    best_so_far, out = -1.0, []
    for row in sorted(rows, key=lambda r: (r["usd_per_hour"], -r["goodput_per_s"])):
        if row["goodput_per_s"] > best_so_far:
            out.append(row)
            best_so_far = row["goodput_per_s"]
    return out


def recommend(rows: list[dict], slo: Slo, budget: float) -> tuple[dict, str]:
    within = [r for r in rows if r["usd_per_hour"] <= budget] or rows
    meeting = [r for r in within if r["attainment"] >= slo.attainment]
    if meeting:
        best = min(meeting, key=lambda r: (r["usd_per_hour"], -r["attainment"]))
        return best, (f"{best['fleet']} is the cheapest fleet meeting {slo.attainment:.0%} "
                      f"({best['attainment']:.1%}) at ${best['usd_per_hour']:.2f}/h")  # fmt: skip
    best = max(within, key=lambda r: (r["goodput_per_s"], -r["usd_per_hour"]))
    return best, (f"no fleet within the budget meets {slo.attainment:.0%}; {best['fleet']} "
                  f"has the most goodput ({best['attainment']:.1%} attained)")  # fmt: skip


def plot(rows: list[dict], front: list[dict], chosen: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([r["usd_per_hour"] for r in rows], [r["goodput_per_s"] for r in rows],
               s=18, color="0.6", label="fleets replayed")  # fmt: skip
    ax.plot([r["usd_per_hour"] for r in front], [r["goodput_per_s"] for r in front],
            "o-", color="C0", label="frontier")  # fmt: skip
    for r in front:
        ax.annotate(r["fleet"], (r["usd_per_hour"], r["goodput_per_s"]), fontsize=7)
    ax.scatter([chosen["usd_per_hour"]], [chosen["goodput_per_s"]], s=120, facecolors="none",
               edgecolors="C3", label=f"recommended {chosen['fleet']}")  # fmt: skip
    ax.set_xlabel("$/hour")
    ax.set_ylabel("goodput (requests meeting both SLOs per s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(args: argparse.Namespace) -> int:
    requests = read_trace(args.trace, speed=args.speed, limit=args.limit,
                          length_scale=args.length_scale)  # fmt: skip
    if len(requests) < 2:
        print("pdserve plan: the trace needs at least two requests", file=sys.stderr)
        return 2
    rows = sweep(args, requests)
    front = frontier(rows)
    chosen, reason = recommend(rows, args.slo, args.budget)
    print(f"{'fleet':>8} {'attained':>9} {'(model)':>8} {'good/s':>8} {'$/h':>7} {'good/$':>8}  "
          "frontier")  # fmt: skip
    for row in sorted(rows, key=lambda r: (r["usd_per_hour"], r["prefill"])):
        print(f"{row['fleet']:>8} {row['attainment']:>9.1%} {row['model_attainment']:>8.1%} "
              f"{row['goodput_per_s']:>8} "
              f"{row['usd_per_hour']:>7.2f} {row['good_requests_per_usd']:>8}  "
              f"{'*' if row in front else ''}")  # fmt: skip
    print(f"recommended: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"command": " ".join(sys.argv), "slo": asdict(args.slo), "trace": str(args.trace),
              "requests": len(requests), "fleets": rows, "frontier": [r["fleet"] for r in front],
              "recommended": chosen, "reason": reason}  # fmt: skip
    (args.out / "plan.json").write_text(json.dumps(report, indent=1))
    plot(rows, front, chosen, args.out / "plan.png")
    return 0
