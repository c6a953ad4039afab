"""Four ways to size a P/D fleet on one day-shaped workload, on sims, in one run.

The workload: the shared Mooncake trace's requests (lengths and prefix ids, in order),
sent as Poisson arrivals whose rate follows a compressed day (``--day-s``, from
``--trough`` x peak up to ``--peak-rate`` and back). From ``--shift-at`` of the day on,
outputs are cut by ``--shift-output-divisor``: a conversation mix turning into a
prefill-heavy, code-like one (the Azure code trace's outputs are ~8x shorter than its
conversation trace's; that trace cannot be fetched here, so the shift is synthesized).

The fleets, each replayed on the sim engines on simulated time (sim/fleet_replay.py):
1. **fixed, with hindsight**: every fixed P/D around the planner model's pick for the
   peak is run; the cheapest that meets the attainment target is reported;
2. **llm-d style**: saturation ``max(p90 TTFT / SLO, p90 ITL / SLO)`` per pool, smoothed,
   +1 above 0.55, -1 below 0.40, no scale-up while that pool has a worker warming up;
3. **Dynamo style**: the load-based stepper, +1 to a pool when every engine's p90 is
   over the SLO, -1 when every engine's is under half of it.
   Both peers are adapted to P/D the same way: ITL charges the decode pool, and TTFT the
   pools whose engines hold a queue (a decode engine's queue is requests waiting for KV),
   prefill when neither does. Charged to prefill alone, a TTFT miss caused by decode KV
   running out grows prefill while decode starves (a first run did exactly that: 14%);
4. **pdserve's planner** (router/fleet/planner.py), on what the interval showed.

Then a load step (the rate doubles) for the planner and the peers: how many intervals
until an interval's attainment is back at the target.

    python -m benchmarks.planner [--day-s 1800] [--peak-rate 10]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from contracts.machine import machine_record
from loadgen.traces import DEFAULT_TRACE, TraceRequest, read_trace
from router.fleet.planner import Planner, PlannerPolicy
from router.fleet.planner_model import (
    Fleet,
    Load,
    Slo,
    Speeds,
    fleets,
    predict,
    speeds_from_profile,
)  # fmt: skip
from router.fleet.planner_window import IntervalSample, PlannerWindow, Pressure
from sim.fleet_replay import Controller, FleetSize, Observation, ReplayResult, slo_outcome
from sim.fleet_replay import replay as replay_fleet
from sim.profile import TimingProfile, load_profile


@dataclass(frozen=True)
class Setup:
    profile: TimingProfile
    slo: Slo
    usd_per_worker_hour: float
    interval_s: float
    start_s: float
    max_workers: int


def day_shaped(
    trace: list[TraceRequest], *, day_s: float, peak_rate: float, trough: float,
    shift_at: float, shift_output_divisor: float, seed: int,
) -> list[TraceRequest]:  # fmt: skip
    """Poisson arrivals at rate ``peak x (trough + (1 - trough) x (1 - cos(2 pi t / day)) / 2)``,
    by thinning, with the trace's requests in order (cycled if the day needs more)."""
    rng = random.Random(seed)
    out, at_s = [], 0.0
    while (at_s := at_s + rng.expovariate(peak_rate)) < day_s:
        shape = trough + (1 - trough) * (1 - math.cos(2 * math.pi * at_s / day_s)) / 2
        if rng.random() >= shape:
            continue
        source = trace[len(out) % len(trace)]
        output = source.output_tokens
        if at_s >= shift_at * day_s:
            output = max(1, round(output / shift_output_divisor))
        out.append(replace(source, send_at_s=at_s, output_tokens=output))
    return out


def stepped(trace: list[TraceRequest], *, rate: float, step_at_s: float, end_s: float,
            seed: int) -> list[TraceRequest]:  # fmt: skip
    """Poisson at ``rate``, doubling at ``step_at_s``."""
    rng = random.Random(seed)
    out, at_s = [], 0.0
    while True:
        at_s += rng.expovariate(rate * (2 if at_s >= step_at_s else 1))
        if at_s >= end_s:
            return out
        out.append(replace(trace[len(out) % len(trace)], send_at_s=at_s))


def prior_speeds(profile: TimingProfile) -> Speeds:
    return speeds_from_profile(asdict(profile))


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))] if values else 0.0


def _bounded(fleet: FleetSize, max_workers: int) -> FleetSize:
    prefill, decode = max(1, fleet.prefill), max(1, fleet.decode)
    while prefill + decode > max_workers:
        if prefill >= decode:
            prefill -= 1
        else:
            decode -= 1
    return FleetSize(prefill, decode)


def _total(observation: Observation) -> FleetSize:
    return FleetSize(observation.serving.prefill + observation.starting.prefill,
                     observation.serving.decode + observation.starting.decode)  # fmt: skip


def _queued(observation: Observation, role: str) -> bool:
    return any(w.waiting for w in observation.workers if w.role == role)


def _ttft_pools(observation: Observation) -> tuple[str, ...]:
    """Where a TTFT miss is charged: the pools whose engines hold a queue (decode's is
    requests waiting for KV), prefill when neither does."""
    queued = tuple(pool for pool in ("prefill", "decode") if _queued(observation, pool))
    return queued or ("prefill",)


def llmd_style(
    setup: Setup, *, up: float = 0.55, down: float = 0.40, smooth: float = 0.5
) -> Controller:
    """Saturation ``max(p90 TTFT / SLO, p90 ITL / SLO)``, per pool: ITL charges decode,
    TTFT the pools holding a queue."""
    smoothed = {"prefill": 0.0, "decode": 0.0}

    def control(observation: Observation) -> FleetSize | None:
        if not observation.served:
            return None
        ttft = _p90([s.ttft_s for s in observation.served]) / setup.slo.ttft_s
        saturation = {
            "prefill": 0.0,
            "decode": _p90([s.itl_s for s in observation.served]) / setup.slo.itl_s,
        }
        for pool in _ttft_pools(observation):
            saturation[pool] = max(saturation[pool], ttft)
        counts = {"prefill": _total(observation).prefill, "decode": _total(observation).decode}
        warming = {"prefill": observation.starting.prefill, "decode": observation.starting.decode}
        for pool, value in saturation.items():
            smoothed[pool] = smooth * value + (1 - smooth) * smoothed[pool]
            if smoothed[pool] > up and not warming[pool]:
                counts[pool] += 1
            elif smoothed[pool] < down:
                counts[pool] -= 1
        return _bounded(FleetSize(counts["prefill"], counts["decode"]), setup.max_workers)

    return control


def dynamo_style(
    setup: Setup, *, up_fraction: float = 1.0, down_fraction: float = 0.5
) -> Controller:
    """+1 to a pool when every engine of it is over ``up_fraction`` of its SLA, -1 when every
    one is under ``down_fraction`` of it: prefill engines by their requests' p90 TTFT,
    decode engines by p90 ITL, or by TTFT while they hold a queue (requests waiting for KV)."""

    def control(observation: Observation) -> FleetSize | None:
        charged = _ttft_pools(observation)
        by_engine: dict[str, list[float]] = {}
        for s in observation.served:
            by_engine.setdefault(s.decode_worker, []).append(s.itl_s / setup.slo.itl_s)
            for pool in charged:
                worker = s.prefill_worker if pool == "prefill" else s.decode_worker
                by_engine.setdefault(worker, []).append(s.ttft_s / setup.slo.ttft_s)
        counts = {"prefill": _total(observation).prefill, "decode": _total(observation).decode}
        for pool in counts:
            p90s = [_p90(v) for name, v in by_engine.items() if name.startswith(pool)]
            if not p90s:
                continue
            if min(p90s) > up_fraction:
                counts[pool] += 1
            elif max(p90s) < down_fraction:
                counts[pool] -= 1
        return _bounded(FleetSize(counts["prefill"], counts["decode"]), setup.max_workers)

    return control


def interval_sample(setup: Setup, observation: Observation) -> IntervalSample:
    served = observation.served
    return IntervalSample(
        end_s=observation.now_s, duration_s=observation.interval_s,
        arrivals=observation.arrivals,
        lengths=tuple((s.input_tokens, s.output_tokens) for s in served),
        met_slo=sum(s.ttft_s <= setup.slo.ttft_s and s.itl_s <= setup.slo.itl_s for s in served),
        input_tokens=sum(s.input_tokens for s in served),
        cached_tokens=sum(s.cached_tokens for s in served),
        prefill_work=tuple((w.finished, w.computed_tokens, w.busy_s)
                           for w in observation.workers if w.role == "prefill"),
        decode_work=tuple((w.steps, w.generated_tokens, w.busy_s)
                          for w in observation.workers if w.role == "decode"),
        pressure=pressure(observation),
    )  # fmt: skip


def pressure(observation: Observation) -> Pressure:
    """What the live planner reads from /metrics: the prefill engines' queues, the decode
    pool's mean KV usage and its preemptions over the interval."""
    decode = [w for w in observation.workers if w.role == "decode"]
    return Pressure(
        waiting_requests=sum(w.waiting for w in observation.workers if w.role == "prefill"),
        decode_kv_usage=sum(w.kv_usage for w in decode) / len(decode) if decode else None,
        decode_preemptions=sum(w.preemptions for w in decode),
    )


def pdserve_planner(
    setup: Setup, policy: PlannerPolicy, log: list[dict], *, pressure_read: bool = True
) -> Controller:
    """``pressure_read=False``: the planner as it was before it read queues, KV usage and
    preemptions (rates, lengths and speeds only), for the comparison in the same run."""
    window = PlannerWindow(window_s=4 * setup.interval_s, prior=prior_speeds(setup.profile))
    planner = Planner(window=window, slo=setup.slo, policy=policy)
    previous: list[FleetSize] = []

    def control(observation: Observation) -> FleetSize | None:
        total = _total(observation)
        settled = not observation.starting.prefill and not observation.starting.decode and (
            previous[-1:] == [total])  # fmt: skip
        previous.append(total)
        fleet = Fleet(prefill=total.prefill, decode=total.decode)
        sample = interval_sample(setup, observation)
        if not pressure_read:
            sample = replace(sample, pressure=Pressure())
        decision = planner.step(sample, fleet, settled=settled)
        if decision is None:
            return None
        log.append({"t_s": round(observation.now_s), "fleet": str(decision.fleet),
                    "reason": decision.reason, "shortfall": round(planner.shortfall, 3),
                    "predicted_attainment": round(decision.prediction.attainment, 3)})  # fmt: skip
        return (
            FleetSize(decision.fleet.prefill, decision.fleet.decode) if decision.changes else None
        )

    return control


def replay(setup: Setup, workload: list[TraceRequest], start: FleetSize,
           controller: Controller | None, until_s: float) -> ReplayResult:  # fmt: skip
    return replay_fleet(setup.profile, workload, start=start, until_s=until_s,
                        start_s=setup.start_s, interval_s=setup.interval_s,
                        controller=controller)  # fmt: skip


def summary(setup: Setup, result: ReplayResult, duration_s: float) -> dict:
    outcome = slo_outcome(result, ttft_s=setup.slo.ttft_s, itl_s=setup.slo.itl_s)
    usd = outcome.worker_hours * setup.usd_per_worker_hour
    return {
        "requests": outcome.requests,
        "ttft_attainment": round(outcome.share(outcome.ttft_met), 4),
        "itl_attainment": round(outcome.share(outcome.itl_met), 4),
        "attainment": round(outcome.share(outcome.met), 4),
        "gpu_hours": round(outcome.worker_hours, 3),
        "mean_workers": round(result.worker_seconds / duration_s, 2),
        "usd": round(usd, 3),
        "usd_per_million_tokens": round(usd / outcome.tokens * 1e6, 4),
        "goodput_per_s": round(outcome.met / duration_s, 3),
        "changes": result.changes,
    }


def series(setup: Setup, result: ReplayResult) -> dict:
    """Per interval: the serving fleet, and the attainment of requests sent in it."""
    buckets: dict[int, list[bool]] = {}
    for s in result.served:
        ok = s.ttft_s <= setup.slo.ttft_s and s.itl_s <= setup.slo.itl_s
        buckets.setdefault(int(s.at_s // setup.interval_s), []).append(ok)
    return {
        "fleet": [(round(t), p, d) for t, p, d in result.fleet_timeline],
        "attainment": [
            (i * setup.interval_s, round(sum(v) / len(v), 3)) for i, v in sorted(buckets.items())
        ],
        "decisions": [(round(t), f.prefill, f.decode) for t, f in result.decisions],
    }


def peak_pick(setup: Setup, workload: list[TraceRequest], peak_rate: float) -> Fleet:
    """The planner model's cheapest fleet for the day's peak (where the fixed sweep starts)."""
    lengths = tuple((r.input_tokens, r.output_tokens) for r in workload[:4096])
    load = Load(rate_per_s=peak_rate, prefix_hit=0.0, lengths=lengths)
    speeds = prior_speeds(setup.profile)
    meeting = [f for f in fleets(2, setup.max_workers)
               if predict(f, load, speeds, setup.slo, 1.0).meets(setup.slo)]  # fmt: skip
    return (
        min(meeting, key=lambda f: (f.workers, -f.prefill))
        if meeting
        else Fleet(
            prefill=setup.max_workers // 2, decode=setup.max_workers - setup.max_workers // 2
        )
    )


def best_fixed(setup: Setup, workload: list[TraceRequest], day_s: float, peak: Fleet,
               say: Callable[[str], None]) -> tuple[dict, list[dict]]:  # fmt: skip
    """Fixed fleets from smallest up, around the peak pick's split; the cheapest meeting the
    target wins (hindsight: every candidate ran the whole day)."""
    tried: list[dict] = []
    share = peak.prefill / peak.workers
    for total in range(max(2, peak.workers - 2), setup.max_workers + 1):
        centre = min(total - 1, max(1, round(share * total)))
        for prefill in sorted({centre, max(1, centre - 1), min(total - 1, centre + 1)}):
            fleet = FleetSize(prefill, total - prefill)
            started = time.perf_counter()
            result = replay(setup, workload, fleet, None, day_s)
            row = {"fleet": f"{fleet.prefill}P+{fleet.decode}D", **summary(setup, result, day_s)}
            say(f"fixed {row['fleet']}: attainment {row['attainment']:.3f} "
                f"({time.perf_counter() - started:.0f}s)")  # fmt: skip
            tried.append(row | {"series": series(setup, result)})
        meeting = [r for r in tried if r["attainment"] >= setup.slo.attainment]
        if meeting:
            return min(meeting, key=lambda r: (r["usd"], -r["attainment"])), tried
    return max(tried, key=lambda r: r["attainment"]), tried


def dynamic_runs(setup: Setup, policy: PlannerPolicy, workload: list[TraceRequest],
                 start: FleetSize, until_s: float, say: Callable[[str], None]) -> dict:  # fmt: skip
    runs = {}
    planner_log: list[dict] = []
    controllers = {
        "llm-d style (saturation 0.55/0.40)": llmd_style(setup),
        "Dynamo style (load-based +-1)": dynamo_style(setup),
        "pdserve planner": pdserve_planner(setup, policy, planner_log),
        "pdserve planner, rates only": pdserve_planner(setup, policy, [], pressure_read=False),
    }
    for name, controller in controllers.items():
        started = time.perf_counter()
        result = replay(setup, workload, start, controller, until_s)
        runs[name] = summary(setup, result, until_s) | {"series": series(setup, result)}
        say(f"{name}: attainment {runs[name]['attainment']:.3f}, "
            f"{runs[name]['gpu_hours']} GPU-h ({time.perf_counter() - started:.0f}s)")  # fmt: skip
    runs["pdserve planner"]["decisions"] = [d for d in planner_log if d["fleet"]][:2000]
    return runs


PEER_SETTINGS = {
    "llm-d style 0.45/0.30": lambda setup: llmd_style(setup, up=0.45, down=0.30),
    "llm-d style 0.35/0.20": lambda setup: llmd_style(setup, up=0.35, down=0.20),
    "Dynamo style up 0.7, down 0.35": lambda setup: dynamo_style(
        setup, up_fraction=0.7, down_fraction=0.35
    ),
    "Dynamo style up 0.5, down 0.25": lambda setup: dynamo_style(
        setup, up_fraction=0.5, down_fraction=0.25
    ),
}


def tuned_peers(setup: Setup, workload: list[TraceRequest], start: FleetSize, until_s: float,
                say: Callable[[str], None]) -> dict:  # fmt: skip
    """The peers with tighter thresholds (chosen with hindsight, on this very run): the
    cheapest way each reaches the attainment target, if any setting does."""
    runs = {}
    for name, make in PEER_SETTINGS.items():
        result = replay(setup, workload, start, make(setup), until_s)
        runs[name] = summary(setup, result, until_s) | {"series": series(setup, result)}
        say(f"{name}: attainment {runs[name]['attainment']:.3f}, {runs[name]['gpu_hours']} GPU-h")
    return runs


def recovery(setup: Setup, run: dict, step_at_s: float) -> dict:
    """Intervals after the step until attainment is back at the target for 3 in a row;
    changes per interval in the steady stretches (before the step, and its last third)."""
    points = [(t, a) for t, a in run["series"]["attainment"] if t >= step_at_s]
    restored = None
    for i in range(len(points)):
        if all(a >= setup.slo.attainment for _, a in points[i : i + 3]) and len(points[i:]) >= 3:
            restored = i
            break
    end_s = points[-1][0] if points else step_at_s
    steady = [(step_at_s / 3, step_at_s), (end_s - (end_s - step_at_s) / 3, end_s)]
    changes = sum(lo <= t < hi for t, _, _ in run["series"]["decisions"] for lo, hi in steady)
    intervals = sum(hi - lo for lo, hi in steady) / setup.interval_s
    return {"intervals_to_restore": restored, "steady_changes_per_interval":
            round(changes / intervals, 3) if intervals else None}  # fmt: skip


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    day = report["day"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=False)
    for name, run in day.items():
        fleet = run["series"]["fleet"]
        axes[0].step([t for t, _, _ in fleet], [p + d for _, p, d in fleet], where="post",
                     label=f"{name} ({run['gpu_hours']} GPU-h)")  # fmt: skip
        attained = run["series"]["attainment"]
        axes[1].plot([t for t, _ in attained], [a for _, a in attained], label=name, lw=1)
    axes[0].set_ylabel("serving workers (P+D)")
    axes[0].set_title("Day-shaped Mooncake replay: fleet size")
    axes[0].legend(fontsize=7)
    axes[1].axhline(report["settings"]["attainment"], color="k", ls=":", lw=1)
    axes[1].set_ylabel("SLO attainment per interval")
    axes[1].set_ylim(0, 1.02)
    for name, run in report["step"].items():
        attained = run["series"]["attainment"]
        axes[2].plot([t for t, _ in attained], [a for _, a in attained], label=name, lw=1)
    axes[2].axvline(report["settings"]["step_at_s"], color="k", ls="--", lw=1)
    axes[2].set_ylabel("attainment (load step)")
    axes[2].set_xlabel("simulated seconds")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(report: dict) -> str:
    lines = [
        "# SLO planner against fixed and peer-style fleets (sims, one run)", "",
        f"`{report['command']}` at {report['machine'].get('commit')}; "
        f"{report['machine'].get('cpu_model')}, {report['machine'].get('cores')} cores.", "",
        "| fleet | attainment (TTFT, ITL) | GPU-hours | of best fixed | $/1M tokens | changes |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    fixed = next(run for name, run in report["day"].items() if name.startswith("fixed"))
    for name, run in report["day"].items():
        lines.append(
            f"| {name} | {run['attainment']:.1%} ({run['ttft_attainment']:.1%}, "
            f"{run['itl_attainment']:.1%}) | {run['gpu_hours']} | "
            f"{run['gpu_hours'] / fixed['gpu_hours']:.0%} | {run['usd_per_million_tokens']} "
            f"| {run['changes']} |"
        )
    lines += ["", "Load step (the rate doubles):", ""]
    lines += ["| fleet | intervals to restore | steady changes / interval |", "|---|---|---|"]
    for name, run in report["step"].items():
        lines.append(f"| {name} | {run['recovery']['intervals_to_restore']} | "
                     f"{run['recovery']['steady_changes_per_interval']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--day-s", type=float, default=1800.0)
    parser.add_argument("--peak-rate", type=float, default=10.0)
    parser.add_argument("--trough", type=float, default=0.25)
    parser.add_argument("--shift-at", type=float, default=0.5)
    parser.add_argument("--shift-output-divisor", type=float, default=8.0)
    parser.add_argument("--ttft-slo-s", type=float, default=2.0)
    parser.add_argument("--itl-slo-s", type=float, default=0.04)
    parser.add_argument("--attainment", type=float, default=0.95)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--start-s", type=float, default=30.0, help="worker start or reload")
    parser.add_argument("--max-workers", type=int, default=16)
    parser.add_argument("--usd-per-worker-hour", type=float, default=3.0)
    parser.add_argument("--step-s", type=float, default=1200.0, help="the load step run's length")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_record()  # at the start: the commit whose code runs
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    setup = Setup(load_profile(args.profile), Slo(ttft_s=args.ttft_slo_s, itl_s=args.itl_slo_s,
                  attainment=args.attainment), args.usd_per_worker_hour, args.interval_s,
                  args.start_s, args.max_workers)  # fmt: skip
    policy = PlannerPolicy(usd_per_worker_hour=args.usd_per_worker_hour,
                           max_workers=args.max_workers, lead_s=2 * args.start_s,
                           min_change_interval_s=3 * args.interval_s,
                           change_cost_s=args.start_s)  # fmt: skip
    trace = read_trace(args.trace)
    workload = day_shaped(trace, day_s=args.day_s, peak_rate=args.peak_rate, trough=args.trough,
                          shift_at=args.shift_at, shift_output_divisor=args.shift_output_divisor,
                          seed=args.seed)  # fmt: skip
    peak = peak_pick(setup, workload, args.peak_rate)
    start = FleetSize(
        max(1, round(peak.prefill * args.trough)), max(1, round(peak.decode * args.trough))
    )
    say(f"{len(workload)} requests over {args.day_s:.0f}s; the model's peak pick {peak}")
    fixed, tried = best_fixed(setup, workload, args.day_s, peak, say)
    day = {f"fixed {fixed['fleet']} (best with hindsight)": fixed}
    day |= dynamic_runs(setup, policy, workload, start, args.day_s, say)
    day |= tuned_peers(setup, workload, start, args.day_s, say)
    step_at = args.step_s / 2
    steps = stepped(trace, rate=args.peak_rate * 0.4, step_at_s=step_at, end_s=args.step_s,
                    seed=args.seed)  # fmt: skip
    step = dynamic_runs(setup, policy, steps, start, args.step_s, say)
    for run in step.values():
        run["recovery"] = recovery(setup, run, step_at)
    report = {
        "machine": machine,
        "command": "python -m benchmarks.planner " + " ".join(argv or sys.argv[1:]),
        "settings": vars(args)
        | {
            "out": str(args.out),
            "trace": str(args.trace),
            "step_at_s": step_at,
            "peak_pick": str(peak),
        },
        "workload": {"requests": len(workload), "trace_requests": len(trace), "dropped": 0},
        "fixed_sweep": [{k: v for k, v in r.items() if k != "series"} for r in tried],
        "day": day,
        "step": step,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    plot(report, args.out / "planner.png")
    (args.out / "planner.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / "planner.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
