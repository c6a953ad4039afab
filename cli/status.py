"""``pdserve status``: the factory at a glance in a terminal, refreshed in place.

Per model: P:D counts, the router's queue, recent TTFT p50/p99, tokens/s in and out, and
$/1M tokens; per embedding model: workers, latency p50/p99, input tokens/s and $/1M
input tokens; per worker: role, state, load, KV usage and engine memory. It reads
``GET /admin/v1/status`` with a viewer token (``PDSERVE_VIEWER_TOKEN``; an admin token
works too). ``--once`` prints one frame, for scripts.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cli.admin import Caller, endpoint
from contracts.status import ModelStatus, StatusSnapshot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--router-url", default=os.environ.get("PDSERVE_ROUTER_URL"))
    parser.add_argument(
        "--token",
        default=os.environ.get("PDSERVE_VIEWER_TOKEN") or os.environ.get("PDSERVE_ADMIN_TOKEN"),
        help="a viewer-scoped token (default: PDSERVE_VIEWER_TOKEN, or the newest run's)",
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="default: the newest run")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--interval-s", type=float, default=2.0, help="refresh period")


def main(args: argparse.Namespace) -> int:
    call = Caller(*endpoint(args))

    def frame() -> Group:
        return render(StatusSnapshot.model_validate(call("GET", "/admin/v1/status")))

    if args.once:
        Console().print(frame())
        return 0
    with Live(frame(), auto_refresh=False, screen=False) as live:
        try:
            while True:
                time.sleep(args.interval_s)
                live.update(frame(), refresh=True)
        except KeyboardInterrupt:
            return 0


def render(snapshot: StatusSnapshot) -> Group:
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.taken_at_unix_s))
    title = Text(f"pdserve status  ·  {taken}  ·  rates over {snapshot.window_s:.0f} s",
                 style="bold")  # fmt: skip
    if not snapshot.models:
        return Group(title, Text("no workers registered"))
    generating = [m for m in snapshot.models if not m.embeds]
    embedding = [m for m in snapshot.models if m.embeds]
    tables = [_models_table(generating)] if generating else []
    if embedding:
        tables.append(_embeddings_table(embedding))
    routed = [m for m in snapshot.models if m.route]
    if routed:
        routes = Table(box=box.SIMPLE_HEAD, title="routes", title_justify="left")
        routes.add_column("model")
        routes.add_column("stages (version, canary weight, shadow sample rate)")
        for m in routed:
            routes.add_row(m.model, m.route)
        tables.append(routes)
    if snapshot.batches:
        line = ", ".join(f"{count} {status}" for status, count in sorted(snapshot.batches.items()))
        tables.append(Text(f"batches (newest 100): {line}"))
    if snapshot.plans:
        tables.append(_plans_table(snapshot))
    return Group(title, *tables, _workers_table(snapshot.models))


def _plans_table(snapshot: StatusSnapshot) -> Table:
    """The SLO planner's plan per model (`pdserve planner`), with its reason."""
    plans = Table(box=box.SIMPLE_HEAD, title="planner", title_justify="left")
    for column in ("model", "mode", "now", "plan", "predicted", "measured", "why"):
        plans.add_column(column)
    for model, plan in sorted(snapshot.plans.items()):
        measured = "-" if plan.measured_attainment is None else f"{plan.measured_attainment:.0%}"
        plans.add_row(
            model, plan.mode + (" (applied)" if plan.applied else ""),
            f"{plan.current_prefill}P+{plan.current_decode}D", f"{plan.prefill}P+{plan.decode}D",
            f"{plan.predicted_attainment:.0%}", measured, plan.reason,
        )  # fmt: skip
    return plans


def _models_table(models: list[ModelStatus]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="models", title_justify="left")
    for name in ("model", "pools", "queued", "TTFT p50", "TTFT p99", "tok/s in", "tok/s out",
                 "$/1M in", "$/1M out"):  # fmt: skip
        table.add_column(name, justify="left" if name in ("model", "pools") else "right")
    for m in models:
        pools = " ".join(f"{count}{role[0].upper()}" for role, count in m.workers_by_role.items())
        if m.degraded:  # one P/D pool serves whole requests: say it where the P:D is read
            pools += " alone"
        table.add_row(
            m.model, pools, f"{m.queue_waiting_requests} req / {m.queued_prefill_tokens} tok",
            _seconds(m.ttft_p50_s), _seconds(m.ttft_p99_s), f"{m.input_tokens_per_s:,.0f}",
            f"{m.output_tokens_per_s:,.1f}", _dollars(m.usd_per_million_input_tokens),
            _dollars(m.usd_per_million_output_tokens),
        )  # fmt: skip
    return table


def _embeddings_table(models: list[ModelStatus]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="embedding models", title_justify="left")
    for name in ("model", "workers", "latency p50", "latency p99", "tok/s in", "$/1M in"):
        table.add_column(name, justify="left" if name == "model" else "right")
    for m in models:
        table.add_row(
            m.model, str(m.workers_by_role.get("embed", 0)), _seconds(m.embedding_latency_p50_s),
            _seconds(m.embedding_latency_p99_s), f"{m.input_tokens_per_s:,.0f}",
            _dollars(m.usd_per_million_input_tokens),
        )  # fmt: skip
    return table


def _workers_table(models: list[ModelStatus]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="workers", title_justify="left")
    left = ("worker", "role", "version", "state", "kind")
    for name in (*left, "inflight", "running", "waiting", "KV", "memory"):
        table.add_column(name, justify="left" if name in left else "right")
    for m in models:
        for w in m.workers:
            state = Text(w.state, style="green" if w.state == "ready" else "yellow")
            table.add_row(
                w.worker_id, w.role, w.version or "-", state, w.kind, str(w.inflight_requests),
                f"{w.engine_running:.0f}", f"{w.engine_waiting:.0f}",
                f"{w.kv_cache_usage_perc:.0%}", f"{w.engine_memory_bytes / 2**30:.2f} GiB",
            )  # fmt: skip
    return table


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _dollars(value: float | None) -> str:
    return "-" if value is None else f"${value:,.3f}"
