"""``pdserve planner``: the SLO planner as a process beside the routers (off unless run).

Every ``--interval-s`` it scrapes each router's ``/metrics`` (router/fleet/planner_feed.py),
reads the model's pools (``GET /admin/v1/pools``), and asks the planner
(router/fleet/planner.py) for the fleet to run next. Then:
- **recommend** (the default): it publishes the plan and its one-sentence reason
  (``PUT /admin/v1/plans/{model}``); ``GET /admin/v1/plans``, ``pdserve status`` and this
  process's own ``/metrics`` show it. A ``planner``-scoped token suffices;
- **apply**: it also asks the ratio API for the fleet (``PUT /admin/v1/pools/{model}``),
  which runs the configured scaler: local re-roling (the total stays, so the planner
  plans splits of today's total) or Kubernetes (sizes within ``--min/--max-workers``).
  Needs an ``operator`` token.
Every change of plan is in the router's audit log (the plan's publication) and, applied,
as the pool operation it started. The token is read from ``PDSERVE_PLANNER_TOKEN`` or
``--token-file``, never from the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from contracts.plans import FleetPlan
from router.fleet.planner import Decision, Planner, PlannerPolicy
from router.fleet.planner_feed import Scrape, interval_sample, parse_metrics, worker_usd_per_hour
from router.fleet.planner_model import Fleet, Slo, parse_slo, speeds_from_profile
from router.fleet.planner_window import PlannerWindow

log = logging.getLogger("pdserve.planner")


def slo_argument(spec: str) -> Slo:
    """``--slo``'s type (this command's and ``pdserve plan``'s): the error names the format."""
    try:
        return parse_slo(spec)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--router", action="append", required=True, dest="routers",
                        help="a router replica's URL; repeat for every replica")  # fmt: skip
    parser.add_argument("--model", required=True, help="the served model to plan for")
    parser.add_argument("--mode", choices=("recommend", "apply"), default="recommend")
    parser.add_argument(
        "--slo", type=slo_argument, required=True, help="ttft=S,itl=S[,attainment=F]"
    )
    parser.add_argument(
        "--profile", type=Path, required=True,
        help="the engine's timing profile (JSON, as `pdserve sim calibrate` writes it; "
        "sim/profiles/): the speeds the model plans with",
    )  # fmt: skip
    parser.add_argument(
        "--scaler", choices=("local", "kubernetes"), default="local",
        help="what the router's ratio API runs: local re-roling keeps the total",
    )  # fmt: skip
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument(
        "--start-timeout-s", type=float, default=600.0,
        help="how long to wait at start for a router to answer /metrics; then exit 1 (a "
        "supervisor or Kubernetes restarts it, and the restarts show)",
    )  # fmt: skip
    parser.add_argument(
        "--usd-per-worker-hour", type=float, default=None,
        help="default: the router's cost model (worker_cost_usd_per_hour), as it charged each "
        "pool",
    )  # fmt: skip
    parser.add_argument(
        "--usd-per-decode-worker-hour", type=float, default=None,
        help="a decode worker's, where it differs (default: --usd-per-worker-hour, or the cost "
        "model's for the decode pool)",
    )  # fmt: skip
    parser.add_argument("--min-workers", type=int, default=2)
    parser.add_argument("--max-workers", type=int, default=16)
    parser.add_argument("--budget", type=float, default=math.inf, help="$/hour, at most")
    parser.add_argument("--min-change-interval-s", type=float, default=90.0)
    parser.add_argument(
        "--change-cost-s", type=float, default=60.0,
        help="a start or re-role: seconds paid before the worker serves",
    )  # fmt: skip
    parser.add_argument("--scale-down-margin", type=float, default=0.15)
    parser.add_argument(
        "--kv-usage-high", type=float, default=0.9,
        help="decode KV usage (0-1) read as short of KV, as a preemption is: never fewer "
        "decode workers then, and one more where a fleet meets the SLO",
    )  # fmt: skip
    parser.add_argument(
        "--batch-pace-margin", type=float, default=1.25,
        help="plan running batches' lines this much faster than their deadlines need",
    )  # fmt: skip
    parser.add_argument("--token-file", type=Path, help="else PDSERVE_PLANNER_TOKEN")
    parser.add_argument("--metrics-port", type=int, default=0, help="0: no /metrics")
    parser.add_argument("--metrics-host", default="127.0.0.1")


class PlannerGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.workers = Gauge("pdserve_planner_workers", "Workers the plan wants",
                             ["model", "role"], registry=registry)  # fmt: skip
        self.attainment = Gauge("pdserve_planner_predicted_attainment",
                                "The plan's predicted SLO attainment", ["model"],
                                registry=registry)  # fmt: skip
        self.forecast = Gauge("pdserve_planner_forecast_requests_per_second",
                              "The rate the plan is for", ["model"], registry=registry)  # fmt: skip
        self.shortfall = Gauge("pdserve_planner_model_shortfall",
                               "Predicted minus measured attainment, decayed (the correction)",
                               ["model"], registry=registry)  # fmt: skip
        self.changes = Counter("pdserve_planner_changes", "Plans for another fleet than the "
                               "last", ["model", "mode"], registry=registry)  # fmt: skip

    def show(self, model: str, mode: str, decision: Decision, shortfall: float) -> None:
        self.workers.labels(model, "prefill").set(decision.fleet.prefill)
        self.workers.labels(model, "decode").set(decision.fleet.decode)
        self.attainment.labels(model).set(decision.prediction.attainment)
        self.forecast.labels(model).set(decision.forecast_rate_per_s)
        self.shortfall.labels(model).set(shortfall)
        if decision.changes:
            self.changes.labels(model, mode).inc()


class RouterClient:
    def __init__(self, session: aiohttp.ClientSession, routers: list[str], token: str) -> None:
        self._session = session
        self._routers = [url.rstrip("/") for url in routers]
        self._headers = {"Authorization": f"Bearer {token}"}

    async def scrape(self) -> Scrape:
        texts = []
        for url in self._routers:
            async with self._session.get(url + "/metrics") as answer:
                answer.raise_for_status()
                texts.append(await answer.text())
        return parse_metrics(texts, time.monotonic())

    async def call(self, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
        """The first replica that answers (they share the control state)."""
        error: Exception | None = None
        for url in self._routers:
            try:
                async with self._session.request(method, url + path, json=body,
                                                 headers=self._headers) as answer:  # fmt: skip
                    payload = await answer.json(content_type=None)
                    if answer.status >= 400:
                        raise RuntimeError(f"{method} {path}: {answer.status} {payload}")
                    return payload
            except aiohttp.ClientError as failure:
                error = failure
        raise RuntimeError(f"no router answered {method} {path}: {error}")


def _policy(args: argparse.Namespace, total: int) -> PlannerPolicy:
    local = args.scaler == "local"
    return PlannerPolicy(
        # Until a price is known, a worker-hour is the unit: the fewest workers win.
        usd_per_worker_hour=args.usd_per_worker_hour or 1.0,
        usd_per_decode_worker_hour=args.usd_per_decode_worker_hour,
        min_workers=total if local else args.min_workers,
        max_workers=total if local else args.max_workers,
        budget_usd_per_hour=args.budget, lead_s=args.change_cost_s + args.interval_s,
        scale_down_margin=args.scale_down_margin,
        min_change_interval_s=args.min_change_interval_s, change_cost_s=args.change_cost_s,
        kv_usage_high=args.kv_usage_high, batch_pace_margin=args.batch_pace_margin,
    )  # fmt: skip


def _priced(
    args: argparse.Namespace, policy: PlannerPolicy, before: Scrape, after: Scrape
) -> PlannerPolicy:
    """The policy at each pool's price: given, else as the router's cost model charged it
    over the interval (kept from the last interval while a pool had no worker time)."""
    prefill = args.usd_per_worker_hour or worker_usd_per_hour(
        before, after, model=args.model, pool="prefill")  # fmt: skip
    decode = args.usd_per_decode_worker_hour or args.usd_per_worker_hour or worker_usd_per_hour(
        before, after, model=args.model, pool="decode")  # fmt: skip
    return replace(
        policy, usd_per_worker_hour=prefill or policy.usd_per_worker_hour,
        usd_per_decode_worker_hour=decode or policy.usd_per_decode_worker_hour,
    )  # fmt: skip


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        return args.token_file.read_text().strip()
    token = os.environ.get("PDSERVE_PLANNER_TOKEN", "")
    if not token:
        raise SystemExit("pdserve planner: set PDSERVE_PLANNER_TOKEN or --token-file")
    return token


async def plan_once(
    args: argparse.Namespace, client: RouterClient, planner_of: Callable[[int], Planner],
    before: Scrape, previous: list[Fleet], gauges: PlannerGauges,
) -> Scrape:  # fmt: skip
    """One interval: read, decide, publish (and in apply mode, ask for the fleet)."""
    after = await client.scrape()
    pools = (await client.call("GET", "/admin/v1/pools"))["models"].get(args.model)
    if pools is None:
        log.warning("no workers serve %s yet", args.model)
        return after
    counts = pools["counts"]
    target = pools["target"] or counts
    current = Fleet(prefill=target["prefill"], decode=target["decode"])
    if current.prefill < 1 or current.decode < 1:
        log.warning("%s has %s: a P/D plan needs a worker of each role", args.model, current)
        return after
    settled = counts == target and previous[-1:] == [current]
    previous[:] = [current]
    sample = interval_sample(before, after, model=args.model, slo=args.slo)
    planner = planner_of(current.workers)
    planner.policy = _priced(args, planner.policy, before, after)
    decision = planner.step(sample, current, settled=settled)
    if decision is None:
        return after
    applied = args.mode == "apply" and decision.changes
    measured = sample.met_slo / len(sample.lengths) if sample.lengths else None
    plan = FleetPlan(
        mode=args.mode, prefill=decision.fleet.prefill, decode=decision.fleet.decode,
        current_prefill=current.prefill, current_decode=current.decode,
        reason=decision.reason[:500], forecast_rate_per_s=decision.forecast_rate_per_s,
        predicted_attainment=min(1.0, decision.prediction.attainment),
        measured_attainment=measured, usd_per_hour=decision.prediction.usd_per_hour,
        decided_unix_s=time.time(), applied=applied,
    )  # fmt: skip
    await client.call("PUT", f"/admin/v1/plans/{args.model}", plan.model_dump(mode="json"))
    if applied:
        body = {"prefill": decision.fleet.prefill, "decode": decision.fleet.decode}
        operation = await client.call("PUT", f"/admin/v1/pools/{args.model}", body)
        log.info("applied %s: operation %s", decision.fleet, operation.get("operation"))
    gauges.show(args.model, args.mode, decision, planner.shortfall)
    log.info("plan %s", json.dumps({"model": args.model, "fleet": str(decision.fleet),
                                    "reason": decision.reason}))  # fmt: skip
    return after


async def run(args: argparse.Namespace) -> None:
    prior = speeds_from_profile(json.loads(args.profile.read_text()))
    registry = CollectorRegistry()
    gauges = PlannerGauges(registry)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_host, registry=registry)
    window = PlannerWindow(window_s=4 * args.interval_s, prior=prior)
    planners: dict[int, Planner] = {}

    def planner_of(total: int) -> Planner:
        # With local re-roling the bounds follow the total; the window is shared.
        key = total if args.scaler == "local" else 0
        if key not in planners:
            planners[key] = Planner(window=window, slo=args.slo, policy=_policy(args, total))
        return planners[key]

    timeout = aiohttp.ClientTimeout(total=max(5.0, args.interval_s / 2))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = RouterClient(session, args.routers, _token(args))
        before = await _first_scrape(client, args.interval_s, args.start_timeout_s)
        previous: list[Fleet] = []
        while True:
            await asyncio.sleep(args.interval_s)
            try:
                before = await plan_once(args, client, planner_of, before, previous, gauges)
            except (RuntimeError, aiohttp.ClientError, asyncio.TimeoutError) as error:
                log.warning("planning skipped this interval: %s", error)


class NoRouter(RuntimeError):
    """No router answered /metrics within ``--start-timeout-s``."""


async def _first_scrape(client: RouterClient, interval_s: float, timeout_s: float) -> Scrape:
    """The routers may start after the planner (a pod beside theirs): wait for them, up
    to ``timeout_s``."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            return await client.scrape()
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                raise NoRouter(
                    f"no router answered /metrics within {timeout_s:g} s: {error}"
                ) from None
            log.warning("no router answers /metrics yet (%s); trying again", error)
            await asyncio.sleep(min(interval_s, left_s))


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(run(args))
        except NoRouter as error:
            log.error("%s", error)
            return 1
    return 0
