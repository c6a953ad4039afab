"""``pdserve status`` draws a fixed snapshot exactly as the golden file shows it.

Regenerate after a deliberate change of the view: ``PDSERVE_UPDATE_GOLDEN=1 pytest`` this
file, then read the diff of ``tests/data/status_view.txt``."""

from __future__ import annotations

import io
import os
from pathlib import Path

from rich.console import Console

from cli.status import render
from contracts.plans import FleetPlan
from contracts.status import ModelStatus, StatusSnapshot, WorkerStatus

GOLDEN = Path(__file__).parents[1] / "data" / "status_view.txt"


def worker(
    worker_id: str, role: str, state: str = "ready", version: str | None = None, **load: float
) -> WorkerStatus:
    defaults = dict(inflight_requests=0, engine_running=0.0, engine_waiting=0.0,
                    kv_cache_usage_perc=0.0, engine_memory_bytes=3 * 2**30)  # fmt: skip
    return WorkerStatus(worker_id=worker_id, role=role, state=state, kind="cpu",
                        version=version, **{**defaults, **load})  # fmt: skip


def quiet_model(
    model: str, workers_by_role: dict[str, int], workers: list[WorkerStatus], **fields
) -> ModelStatus:
    """A model with no queue, traffic or price unless ``fields`` say otherwise."""
    defaults = dict(queue_waiting_requests=0, queued_prefill_tokens=0, ttft_p50_s=None,
                    ttft_p99_s=None, ttft_samples=0, input_tokens_per_s=0,
                    output_tokens_per_s=0, usd_per_million_input_tokens=None,
                    usd_per_million_output_tokens=None)  # fmt: skip
    return ModelStatus(model=model, workers_by_role=workers_by_role, workers=workers,
                       **{**defaults, **fields})  # fmt: skip


SNAPSHOT = StatusSnapshot(
    window_s=60,
    taken_at_unix_s=1_796_000_000,
    batches={"in_progress": 2, "completed": 9},
    models=[
        ModelStatus(
            model="smollm2",
            workers_by_role={"prefill": 2, "decode": 1},
            queue_waiting_requests=3,
            queued_prefill_tokens=4096,
            ttft_p50_s=0.412,
            ttft_p99_s=1.87,
            ttft_samples=512,
            input_tokens_per_s=12345.6,
            output_tokens_per_s=987.65,
            usd_per_million_input_tokens=0.0123,
            usd_per_million_output_tokens=0.2469,
            route="prod v1 · canary v2 10%",
            workers=[
                worker(
                    "decode-0",
                    "decode",
                    inflight_requests=7,
                    engine_running=7,
                    kv_cache_usage_perc=0.62,
                ),
                worker(
                    "prefill-0",
                    "prefill",
                    inflight_requests=2,
                    engine_running=1,
                    engine_waiting=1,
                    kv_cache_usage_perc=0.1,
                ),
                worker("prefill-1", "prefill", state="starting", engine_memory_bytes=0),
                worker(
                    "v2-colocated-0",
                    "colocated",
                    version="v2",
                    inflight_requests=1,
                    engine_running=1,
                    kv_cache_usage_perc=0.05,
                ),
            ],
        ),
        quiet_model("idle-model", {"colocated": 1}, [worker("colocated-0", "colocated")]),
        quiet_model(
            "half-pd",
            {"decode": 1},
            [worker("half-decode-0", "decode")],
            ttft_p50_s=0.9,
            ttft_p99_s=0.9,
            ttft_samples=1,
            input_tokens_per_s=10,
            output_tokens_per_s=1,
            degraded="decode",
        ),
        quiet_model(
            "minilm",
            {"embed": 2},
            [
                worker("embed-0", "embed", inflight_requests=1, engine_running=1),
                worker("embed-1", "embed"),
            ],
            input_tokens_per_s=4321,
            usd_per_million_input_tokens=0.0042,
            embedding_latency_p50_s=0.048,
            embedding_latency_p99_s=0.21,
            embedding_samples=300,
        ),
    ],
)


def drawn(snapshot: StatusSnapshot) -> str:
    out = io.StringIO()
    Console(file=out, width=110, color_system=None, force_terminal=False).print(render(snapshot))
    return out.getvalue()


def test_status_view_matches_the_golden_rendering():
    text = drawn(SNAPSHOT)
    if os.environ.get("PDSERVE_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_status_view_says_so_when_nothing_is_registered():
    empty = StatusSnapshot(window_s=60, taken_at_unix_s=0, models=[])
    assert "no workers registered" in drawn(empty)


def test_status_view_shows_the_planners_plan_and_why():
    plan = FleetPlan(
        mode="apply", prefill=3, decode=1, current_prefill=1, current_decode=3,
        reason="1P+3D would meet the SLO for 40% of requests at 5.00 req/s; 3P+1D is the "
        "cheapest at 97%", forecast_rate_per_s=5.0, predicted_attainment=0.97,
        measured_attainment=0.4, usd_per_hour=4.0, decided_unix_s=0.0, applied=True,
    )  # fmt: skip
    text = drawn(SNAPSHOT.model_copy(update={"plans": {"tiny": plan}}))
    assert "planner" in text and "apply (applied)" in text
    assert "1P+3D" in text and "3P+1D" in text and "97%" in text and "40%" in text
    assert "cheapest" in text  # the reason, wrapped or not
    assert "planner" not in drawn(SNAPSHOT)
