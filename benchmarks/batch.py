"""A batch beside interactive traffic, on sim clusters: does the batch tier fill the
room interactive traffic leaves, without hurting it?

Every part starts a fresh sim cluster (``--prefill`` + ``--decode`` sims, the H100
profile ``--time-dilation`` times slower, as in ``admission``; times are dilated) and
replays one open-loop interactive schedule (``--workload``: shared-prefix prompts, or the
production trace's requests, as ``benchmarks.admission`` has them; Poisson at ``--load``
x the interactive capacity, for ``--duration-s``) as tenant ``app``:

- **capacity** (admission off): interactive capacity C_i, then batch capacity C_b, each
  a saturating burst of its own requests straight to the API (finished / makespan);
- **alone**: the interactive schedule alone; **alone again**: once more, how far p99
  moves between two runs of the same requests (the noise the 10% is read against);
- **tier**: the same, plus a ``--lines``-line batch through ``/v1/files`` and
  ``/v1/batches`` (the tier with its default settings) as tenant ``jobs``;
- **tier share S** (``--other-shares``): the tier with ``batch_prefill_share`` S, the
  knob that trades the batch's pace against interactive TTFT;
- **tier, take-back**: the tier with ``batch_prefill_take_back`` on: batch prefills
  under way at a worker are taken back when an interactive prompt is sent there;
- **naive**: the same, plus the same lines sent by a client ``--naive-concurrency`` at a
  time straight to ``/v1/completions`` with priority ``batch`` (what a gateway that only
  caps concurrency does), each 429 retried after its Retry-After;
- **deadline**: the first ``--deadline-run-s`` of the schedule, plus the batch with a
  ``--window`` it cannot meet: when it is flagged at risk, against when it expires.

Batch lines: one shared instruction (``--instruction-tokens``) and a document of their
own (``--document-tokens``), ``--output-tokens`` each, as a batch job over documents is.
Reported: interactive TTFT p99 (and p50, ITL p99, refusals) against alone, and the batch's
lines finished per second while the interactive load ran (or until it finished), against
the room the load leaves: C_b x (1 - the interactive requests finished per second
alone / C_i); and every run's pair of the two against the issue's goals (p99 within 10%
of alone, 70% of the room). Writes ``batch.{json,md,png}`` (``batch_mooncake.*`` for that
workload).

    python -m benchmarks.batch
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from pathlib import Path

import aiohttp

from benchmarks.admission import PROBE, WORKLOADS, open_loop, sim_cluster, workload
from benchmarks.routing_policies import scaled_profile
from contracts.machine import machine_record
from contracts.tokenization import load_tokenizer
from loadgen import datasets
from loadgen.client import RequestResult
from loadgen.metrics import error_kind, percentiles
from loadgen.prometheus_text import scrape
from loadgen.replay import Scheduled, replay
from localrun.cluster import LocalCluster
from modelstore import tiny_llama

MODEL = tiny_llama.SERVED_NAME
TENANTS = {"app": {"keys": ["key-app"]}, "jobs": {"keys": ["key-jobs"]}}
APP = {"Authorization": "Bearer key-app"}
JOBS = {"Authorization": "Bearer key-jobs"}


@contextlib.contextmanager
def cluster(name: str, profile: Path, work: Path, env: dict[str, str],
            args: argparse.Namespace) -> Iterator[LocalCluster]:  # fmt: skip
    router_env = {"PDSERVE_TENANTS": json.dumps(TENANTS), "PDSERVE_BATCH_POLL_S": "0.2", **env}
    local = sim_cluster(name, profile, work, router_env, args)
    try:
        local.start()
        yield local
    finally:
        local.stop()


def batch_bodies(words: datasets.WordSource, args: argparse.Namespace) -> list[dict]:
    instruction = words.run(f"instruction:{args.seed}", args.instruction_tokens)
    return [
        {"model": MODEL, "temperature": 0, "max_tokens": args.output_tokens,
         "prompt": instruction + words.run(f"document:{args.seed}:{i}", args.document_tokens)}
        for i in range(args.lines)
    ]  # fmt: skip


def burst(bodies: list[dict]) -> list[Scheduled]:
    return [Scheduled(i * 0.005, {"model": MODEL, **body}, APP) for i, body in enumerate(bodies)]


def finished_per_s(results: list[RequestResult], what: str) -> float:
    ok = [r for r in results if r.ok]
    if len(ok) < len(results):
        kinds = Counter(error_kind(r) for r in results if not r.ok)
        raise RuntimeError(f"{what} probe: {len(results) - len(ok)} requests failed: {kinds}")
    return len(ok) / max(r.started_s + r.e2e_s for r in ok)


def capacity(profile: Path, work: Path, interactive: list[dict], lines: list[dict],
             args: argparse.Namespace) -> dict:  # fmt: skip
    """Both saturating bursts on one cluster with admission off, interactive first."""
    with cluster("capacity", profile, work, PROBE, args) as local:
        url = local.router_url + "/v1/completions"
        probe = interactive[: args.probe_requests]
        c_i = finished_per_s(asyncio.run(replay(url, burst(probe))), "interactive")
        c_b = finished_per_s(asyncio.run(replay(url, burst(lines[: args.probe_requests]))), "batch")
    print(f"  capacity: interactive {c_i:.2f}/s, batch lines {c_b:.2f}/s", flush=True)
    return {"interactive_rps": c_i, "batch_lines_per_s": c_b}


# -- the batch, as a client of the tier or as the naive executor ----------------


async def _json(answer: Awaitable[aiohttp.ClientResponse]) -> dict:
    async with await answer as response:
        response.raise_for_status()
        return await response.json()


async def submit(http: aiohttp.ClientSession, lines: list[dict], window: str) -> dict:
    data = b"".join(
        json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                    "body": body}).encode() + b"\n"
        for i, body in enumerate(lines)
    )  # fmt: skip
    form = aiohttp.FormData({"purpose": "batch"})
    form.add_field("file", data, filename="lines.jsonl")
    uploaded = await _json(http.post("/v1/files", data=form))
    return await _json(http.post("/v1/batches", json={
        "input_file_id": uploaded["id"], "endpoint": "/v1/completions",
        "completion_window": window}))  # fmt: skip


async def run_tier(local: LocalCluster, lines: list[dict], window: str, until_s: float) -> dict:
    """Submit the batch, then watch it every second until ``until_s`` or its end:
    [(seconds since the submit, lines done, status, at risk)] (at risk: the admin view)."""
    admin = {"Authorization": f"Bearer {local.admin_token}"}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(local.router_url, headers=JOBS, timeout=timeout) as http:
        started = time.perf_counter()
        batch = await submit(http, lines, window)
        trace = []
        while (elapsed := time.perf_counter() - started) < until_s:
            got = await _json(http.get(f"/v1/batches/{batch['id']}"))
            listed = (await _json(http.get("/admin/v1/batches", headers=admin)))["data"]
            risky = any(b["id"] == batch["id"] and b["at_risk"] for b in listed)
            counts = got["request_counts"]
            trace.append((round(elapsed, 2), counts["completed"] + counts["failed"],
                          got["status"], risky))  # fmt: skip
            if got["status"] in ("completed", "failed", "expired", "cancelled"):
                break
            await asyncio.sleep(1.0)
        if trace[-1][2] in ("validating", "in_progress"):  # 409: it ended meanwhile
            async with http.post(f"/v1/batches/{batch['id']}/cancel") as answer:
                if answer.status != 409:
                    answer.raise_for_status()
    return {"batch": {k: batch[k] for k in ("id", "created_at", "expires_at")}, "trace": trace}


async def run_naive(base_url: str, lines: list[dict], concurrency: int, until_s: float) -> dict:
    """Lines ``concurrency`` at a time, each 429/503 retried after its Retry-After, until
    ``until_s``: when each line finished, and the statuses seen."""
    started = time.perf_counter()
    done_at: list[float] = []
    statuses: Counter[str] = Counter()
    queue = iter(lines)

    async def worker(http: aiohttp.ClientSession) -> None:
        for body in queue:
            while time.perf_counter() - started < until_s:
                try:
                    async with http.post("/v1/completions", json=body) as answer:
                        await answer.read()
                except aiohttp.ClientError as error:
                    statuses[type(error).__name__] += 1
                    continue
                statuses[str(answer.status)] += 1
                if answer.status not in (429, 503):
                    done_at.append(time.perf_counter() - started)
                    break
                await asyncio.sleep(float(answer.headers.get("retry-after", 1)))
            else:
                return

    headers = {**JOBS, "x-pdserve-priority": "batch"}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(base_url, headers=headers, timeout=timeout) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    trace = [(round(t, 2), n) for n, t in enumerate(sorted(done_at), 1)]
    return {"trace": trace, "statuses": dict(statuses)}


# -- the parts ------------------------------------------------------------------


def interactive_summary(results: list[RequestResult]) -> dict:
    ok = [r for r in results if r.ok and r.ttft_s is not None]
    return {
        "requests": len(results), "succeeded": len(ok),
        "refused_by_status": dict(Counter(str(r.status) for r in results
                                          if r.status in (413, 429))),
        "other_errors": dict(Counter(error_kind(r) for r in results
                                     if not r.ok and r.status not in (413, 429))),
        "ttft_ms": percentiles([r.ttft_s for r in ok]),
        "itl_ms": percentiles([gap for r in ok for gap in r.itl_s]),
    }  # fmt: skip


def mixed(name: str, profile: Path, work: Path, schedule: list[Scheduled], beside: str,
          lines: list[dict], args: argparse.Namespace, window: str = "24h",
          env: dict[str, str] | None = None) -> dict:  # fmt: skip
    """The schedule, and beside it the batch as ``beside`` runs it (none, tier, naive);
    ``env``: router settings of this run's own."""
    env = {"PDSERVE_TTFT_SLO_S": str(args.slo_ms / 1000),
           **dict(item.split("=", 1) for item in args.router_env), **(env or {})}  # fmt: skip
    span_s = max(item.send_at_s for item in schedule)
    with cluster(name, profile, work, env, args) as local:
        busy_before = prefill_busy_s(local)

        async def both() -> tuple[list[RequestResult], dict | None]:
            url = local.router_url
            batch = {"tier": lambda: run_tier(local, lines, window, span_s),
                     "naive": lambda: run_naive(url, lines, args.naive_concurrency, span_s),
                     }.get(beside)  # fmt: skip
            return await asyncio.gather(
                replay(url + "/v1/completions", schedule, deadline_s=span_s + 120),
                batch() if batch else asyncio.sleep(0, None),
            )

        results, batch = asyncio.run(both())
        busy_after = prefill_busy_s(local)
        busy_s = [after - before for before, after in zip(busy_before, busy_after, strict=True)]
        router = scrape(local.router_url + "/metrics")
    refusals = Counter()  # the router's own, interactive and batch lines alike
    for metric, labels, value in router:
        if metric == "pdserve_admission_rejections_total":
            refusals[labels["reason"]] += value
    taken_back = sum(value for metric, _, value in router
                     if metric == "pdserve_batch_prefills_taken_back_total")  # fmt: skip
    out = {"interactive": interactive_summary(results), "span_s": span_s, "batch": batch,
           "router_refusals": dict(refusals), "results": results, "taken_back": taken_back,
           # Each prefill sim's time in engine steps over the run, of the run's span.
           "prefill_busy": [round(b / span_s, 3) for b in busy_s]}  # fmt: skip
    print(
        f"  [{name}] interactive {out['interactive']['succeeded']}/{len(results)} ok, "
        f"TTFT p99 {out['interactive']['ttft_ms']['p99']:.0f} ms",
        flush=True,
    )
    return out


def prefill_busy_s(local: LocalCluster) -> list[float]:
    """Each prefill sim's seconds in engine steps so far (the sim's own counter)."""
    return [
        sum(value for metric, _, value in scrape(w.engine_url + "/metrics")
            if metric == "sim:engine_busy_seconds_total")
        for w in local.workers if w.role == "prefill"
    ]  # fmt: skip


def lines_per_s(trace: list[tuple], span_s: float, total: int) -> float:
    """Lines finished per second while the interactive load ran, or until the batch
    ended if sooner (a finished batch leaves room unused for want of lines, not pace)."""
    within = [point for point in trace if point[0] <= span_s]
    if not within:
        return 0.0
    end_s, done = within[-1][0], within[-1][1]
    return done / end_s if done >= total else done / span_s


def flagged(run: dict) -> dict:
    """When the deadline run's batch was first seen at risk, and when it expired."""
    batch, trace = run["batch"]["batch"], run["batch"]["trace"]
    window_s = batch["expires_at"] - batch["created_at"]
    at = next((t for t, _, _, risky in trace if risky), None)
    ended = next(((t, status) for t, _, status, _ in trace if status == "expired"), None)
    return {
        "window_s": window_s, "flagged_at_s": at, "expired_seen_at_s": ended and ended[0],
        "flagged_before_expiry": at is not None and at < window_s,
        # Done while it ran (at its end, the lines never run count as failed too).
        "lines_done": max((n for _, n, status, _ in trace if status == "in_progress"),
                          default=0),
        "final_status": trace[-1][2],
    }  # fmt: skip


def run_parts(args: argparse.Namespace, work: Path) -> dict:
    tokenizer = load_tokenizer(str(tiny_llama.ensure()))
    words = datasets.WordSource(tokenizer)
    left_out: list[int] = []  # interactive requests left out for their length
    interactive = workload(args.workload, tokenizer, args.seed, args.output_tokens, left_out)
    lines = batch_bodies(words, args)
    profile = scaled_profile(1.0, args.time_dilation, work)
    caps = capacity(profile, work, interactive, lines, args)
    rate = args.load * caps["interactive_rps"]
    schedule = [Scheduled(item.send_at_s, item.body, APP) for item in open_loop(
        interactive, rate, 0.0, args.duration_s, random.Random(args.seed))]  # fmt: skip
    runs = {beside: mixed(beside, profile, work, schedule, beside, lines, args)
            for beside in ("alone", "tier", "naive")}  # fmt: skip
    # The same schedule alone once more: how far p99 moves between two runs of the same
    # requests with no batch at all, against which the 10% is read.
    runs["alone again"] = mixed("alone-again", profile, work, schedule, "alone", lines, args)
    for share in args.other_shares:  # the trade-off the knob makes
        runs[f"tier share {share}"] = mixed(
            f"tier-{share}", profile, work, schedule, "tier", lines, args,
            env={"PDSERVE_BATCH_PREFILL_SHARE": share})  # fmt: skip
    runs["tier, take-back"] = mixed(
        "tier-take-back", profile, work, schedule, "tier", lines, args,
        env={"PDSERVE_BATCH_PREFILL_TAKE_BACK": "true"})  # fmt: skip
    short = [item for item in schedule if item.send_at_s < args.deadline_run_s]
    runs["deadline"] = mixed("deadline", profile, work, short, "tier", lines, args,
                             window=args.window)  # fmt: skip
    return {"capacity": caps, "offered_rps": rate, "runs": runs, "left_out": left_out}


def summarise(parts: dict, args: argparse.Namespace) -> dict:
    runs, caps = parts["runs"], parts["capacity"]
    alone = runs["alone"]
    served_rps = alone["interactive"]["succeeded"] / alone["span_s"]
    room = caps["batch_lines_per_s"] * max(0.0, 1 - served_rps / caps["interactive_rps"])
    p99 = alone["interactive"]["ttft_ms"]["p99"]
    rows = {}
    for name in [n for n in runs if n != "deadline"]:
        run = runs[name]
        row = {"ttft_p99_ms": run["interactive"]["ttft_ms"]["p99"],
               "ttft_p99_ratio": run["interactive"]["ttft_ms"]["p99"] / p99,
               "ttft_p50_ms": run["interactive"]["ttft_ms"]["p50"],
               "itl_p99_ms": run["interactive"]["itl_ms"]["p99"],
               "interactive_ok": run["interactive"]["succeeded"],
               "interactive_refused": run["interactive"]["refused_by_status"],
               "prefill_busy": statistics.fmean(run["prefill_busy"])}  # fmt: skip
        if run["batch"]:
            done_per_s = lines_per_s(run["batch"]["trace"], run["span_s"], args.lines)
            row |= {"batch_lines_per_s": done_per_s, "room_used": done_per_s / room,
                    "batch_lines_done": run["batch"]["trace"][-1][1],
                    "taken_back": run.get("taken_back", 0)}  # fmt: skip
        rows[name] = row
    # The same requests as the deadline run's (its schedule is the first part of alone's).
    early = runs["alone"]["results"][: len(runs["deadline"]["results"])]
    deadline = flagged(runs["deadline"]) | {
        "ttft_p99_ms": runs["deadline"]["interactive"]["ttft_ms"]["p99"],
        "alone_same_requests_ttft_p99_ms": interactive_summary(early)["ttft_ms"]["p99"],
    }  # fmt: skip
    return {"room_lines_per_s": room, "interactive_served_rps": served_rps, "rows": rows,
            "deadline": deadline}  # fmt: skip


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, summary = report["runs"], report["summary"]
    fig, (ttft, lines, late, goals) = plt.subplots(1, 4, figsize=(21, 4.8))
    colour = {name: f"C{i}" for i, name in enumerate(summary["rows"])}  # one per run
    for name in [n for n in runs if n != "deadline"]:
        values = sorted(ttft_ms for _, ttft_ms, status in runs[name]["results"]
                        if status == 200 and ttft_ms)  # fmt: skip
        shares = [(i + 1) / len(values) for i in range(len(values))]
        row = summary["rows"][name]
        ttft.plot(values, shares, color=colour[name],
                  label=f"{name}: p99 {row['ttft_p99_ms']:.0f} ms "
                        f"({row['ttft_p99_ratio']:.2f}x)")  # fmt: skip
    ttft.set(xlabel="interactive TTFT (ms, dilated)", ylabel="share of requests",
             title="Interactive TTFT with a batch beside it", ylim=(0.9, 1.001))  # fmt: skip
    ttft.legend(fontsize=8)
    span_s = runs["alone"]["span_s"]
    for name in [n for n in runs if runs[n]["batch"] and n != "deadline"]:
        trace = runs[name]["batch"]["trace"]
        row = summary["rows"][name]
        lines.plot([p[0] for p in trace], [p[1] for p in trace], color=colour[name],
                   label=f"{name}: {row['batch_lines_per_s']:.2f} lines/s "
                         f"({row['room_used']:.0%} of the room)")  # fmt: skip
    room = summary["room_lines_per_s"]
    lines.plot([0, span_s], [0, room * span_s], "k--", label=f"the room: {room:.2f} lines/s")
    lines.set(xlabel="seconds", ylabel="batch lines done", title="The batch's progress")
    lines.legend(fontsize=8)
    d = summary["deadline"]  # at its end, the lines never run count as failed: left out
    trace = [p for p in runs["deadline"]["batch"]["trace"] if p[2] == "in_progress"]
    late.plot([p[0] for p in trace], [p[1] for p in trace], label="lines done")
    if d["flagged_at_s"] is not None:
        late.axvline(
            d["flagged_at_s"], color="tab:orange", label=f"flagged at {d['flagged_at_s']:.0f} s"
        )
    late.axvline(d["window_s"], color="tab:red", label=f"expires at {d['window_s']} s")
    late.set(
        xlabel="seconds", ylabel="batch lines done", title="A batch that cannot meet its window"
    )
    late.legend(fontsize=8)
    trade_off(goals, summary["rows"], colour)
    fig.suptitle(f"{report['settings'].get('workload', 'shared-prefix')} workload; "
                 f"{report['machine']['cpu_model']} x{report['machine']['cores']}, "
                 f"commit {report['machine']['commit']}", fontsize=8)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def trade_off(ax, rows: dict, colour: dict[str, str]) -> None:
    """Each run with a batch as a point: the room it used against its p99 / alone, with
    the goals' corner (70% or more of the room, p99 at most 1.10x)."""
    for name, row in rows.items():
        if "room_used" in row:
            ax.scatter(row["room_used"], row["ttft_p99_ratio"], color=colour[name])
            ax.annotate(name, (row["room_used"], row["ttft_p99_ratio"]), fontsize=8,
                        xytext=(4, 4), textcoords="offset points")  # fmt: skip
    ax.axvline(0.7, color="tab:green", linestyle=":")
    ax.axhline(1.1, color="tab:green", linestyle=":", label="goals: right of and below")
    ax.set(xlabel="share of the room the batch used", ylabel="interactive TTFT p99 / alone",
           title="The trade-off", xlim=(0, max(1.0, ax.get_xlim()[1])))  # fmt: skip
    ax.legend(fontsize=8)


def markdown(report: dict) -> str:
    s, caps = report["summary"], report["capacity"]
    out = [
        "# A batch beside interactive traffic (`benchmarks/batch.py`)", "",
        f"Interactive workload: {report['settings'].get('workload', 'shared-prefix')}; "
        f"TTFT SLO {report['settings']['slo_ms']:.0f} ms, time dilation "
        f"{report['settings']['time_dilation']:g}x (times are dilated)"
        + (f"; {len(report['left_out'])} of its requests left out for their length"
           if "left_out" in report else "") + ".", "",
        f"`{report['command']}` at {report['machine']['commit']} on "
        f"{report['machine']['cpu_model']} ({report['machine']['cores']} cores).", "",
        f"Capacity (admission off): interactive {caps['interactive_rps']:.2f} requests/s, batch "
        f"{caps['batch_lines_per_s']:.2f} lines/s. Offered interactive load "
        f"{report['offered_rps']:.2f}/s ({report['settings']['load']:.0%}); served alone "
        f"{s['interactive_served_rps']:.2f}/s, which leaves room for "
        f"{s['room_lines_per_s']:.2f} batch lines/s.", "",
        "| run | TTFT p50 ms | TTFT p99 ms | p99 / alone | ITL p99 ms | interactive ok | refused | "
        "prefill busy | batch lines/s | of the room | prefills taken back |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, row in s["rows"].items():
        out.append(
            f"| {name} | {row['ttft_p50_ms']:.0f} | {row['ttft_p99_ms']:.0f} | "
            f"{row['ttft_p99_ratio']:.2f} | {row['itl_p99_ms']:.0f} | {row['interactive_ok']} | "
            f"{sum(row['interactive_refused'].values())} | {row['prefill_busy']:.0%} | "
            f"{row.get('batch_lines_per_s', 0):.2f} | {row['room_used']:.0%} | "
            f"{row.get('taken_back', 0):.0f} |"
            if "room_used" in row else
            f"| {name} | {row['ttft_p50_ms']:.0f} | {row['ttft_p99_ms']:.0f} | "
            f"{row['ttft_p99_ratio']:.2f} | "
            f"{row['itl_p99_ms']:.0f} | {row['interactive_ok']} | "
            f"{sum(row['interactive_refused'].values())} | {row['prefill_busy']:.0%} | | | |"
        )  # fmt: skip
    met = [n for n, row in s["rows"].items()
           if row.get("room_used", 0) >= 0.7 and row["ttft_p99_ratio"] <= 1.1]  # fmt: skip
    out += ["", "Both goals (TTFT p99 within 10% of alone, 70% of the room or more) met by: "
            + (", ".join(met) if met else "no run") + "."]  # fmt: skip
    d = s["deadline"]
    out += ["", f"Deadline: a {report['settings']['lines']}-line batch with a {d['window_s']}-s "
            f"window was flagged at risk at {d['flagged_at_s']} s and ended "
            f"`{d['final_status']}` ({d['lines_done']} lines done). Interactive TTFT p99 beside "
            f"it {d['ttft_p99_ms']:.0f} ms against {d['alone_same_requests_ttft_p99_ms']:.0f} "
            "ms for the same requests alone: a batch at risk stops yielding.", ""]  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="shared-prefix",
                        help="the interactive load (as benchmarks.admission's)")  # fmt: skip
    parser.add_argument("--prefill", type=int, default=2)
    parser.add_argument("--decode", type=int, default=2)
    parser.add_argument("--time-dilation", type=float, default=25.0)  # as admission's
    parser.add_argument("--slo-ms", type=float, default=2000.0)
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--duration-s", type=float, default=120.0)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--instruction-tokens", type=int, default=512)
    parser.add_argument("--document-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--naive-concurrency", type=int, default=16)
    parser.add_argument("--other-shares", nargs="*", default=["0.25", "1.0"],
                        help="batch_prefill_share values to run the tier at too")  # fmt: skip
    parser.add_argument("--window", default="20s")
    parser.add_argument("--deadline-run-s", type=float, default=40.0)
    parser.add_argument("--probe-requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--router-env", nargs="*", default=[],
                        help="extra router settings, PDSERVE_X=value")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--plot-only", type=Path, metavar="JSON",
                        help="draw batch.png again from a run's batch.json")  # fmt: skip
    args = parser.parse_args(argv)
    if args.plot_only:
        plot(json.loads(args.plot_only.read_text()), args.plot_only.with_suffix(".png"))
        return 0
    report: dict = {
        "machine": machine_record(),
        "command": "python -m benchmarks.batch " + " ".join(argv or sys.argv[1:]),
        "settings": vars(args) | {"out": str(args.out)},
    }
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as tmp:
        report |= run_parts(args, Path(tmp))
    report["summary"] = summarise(report, args)
    for run in report["runs"].values():  # (sent at s, TTFT ms, status) per request
        run["results"] = [(round(r.started_s, 2), r.ttft_s and round(r.ttft_s * 1000), r.status)
                          for r in run["results"]]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "batch" if args.workload == "shared-prefix" else f"batch_{args.workload}"
    plot(report, args.out / f"{stem}.png")
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
