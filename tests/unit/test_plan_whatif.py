"""``pdserve plan``'s pure parts: the SLO argument, the frontier and the recommendation."""

from __future__ import annotations

import argparse

import pytest

from cli.plan import frontier, recommend
from router.fleet.planner_model import Slo
from router.fleet.planner_service import slo_argument


def row(fleet: str, usd: float, goodput: float, attainment: float) -> dict:
    return {"fleet": fleet, "usd_per_hour": usd, "goodput_per_s": goodput, "attainment": attainment,
            "prefill": int(fleet[0]), "decode": int(fleet[3])}  # fmt: skip


ROWS = [
    row("1P+1D", 6, 1.0, 0.40), row("2P+1D", 9, 2.0, 0.80), row("1P+2D", 9, 1.2, 0.45),
    row("3P+1D", 12, 2.4, 0.96), row("2P+2D", 12, 2.1, 0.85), row("3P+2D", 15, 2.4, 0.97),
]  # fmt: skip


def test_the_frontier_keeps_fleets_no_cheaper_one_matches() -> None:
    assert [r["fleet"] for r in frontier(ROWS)] == ["1P+1D", "2P+1D", "3P+1D"]


def test_the_recommendation_is_the_cheapest_meeting_the_target() -> None:
    chosen, reason = recommend(ROWS, Slo(ttft_s=1, itl_s=0.1, attainment=0.95), budget=100)
    assert chosen["fleet"] == "3P+1D" and "cheapest" in reason


def test_without_a_fleet_meeting_it_the_most_goodput_within_budget() -> None:
    chosen, reason = recommend(ROWS, Slo(ttft_s=1, itl_s=0.1, attainment=0.99), budget=10)
    assert chosen["fleet"] == "2P+1D" and "no fleet within the budget" in reason


@pytest.mark.parametrize(
    ("spec", "message"),
    [("ttft=2", "ttft=SECONDS,itl=SECONDS"), ("ttft=a,itl=1", "numbers"),
     ("ttft=2,itl=0.1,p=3", "ttft=SECONDS"), ("ttft=0,itl=0.1", "above 0"),
     ("ttft=1,itl=0.1,attainment=1.5", "attainment")],
)  # fmt: skip
def test_a_bad_slo_says_what_it_takes(spec: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        slo_argument(spec)
    assert slo_argument("ttft=2,itl=0.04,attainment=0.9") == Slo(
        ttft_s=2, itl_s=0.04, attainment=0.9
    )
