"""``PUT /admin/v1/plans/{model}``: a bad plan is refused naming its field, and a plan
for a model no worker serves is a 404; neither is stored."""

from __future__ import annotations

import httpx
import pytest

from tests.router.conftest import running_router

PLANNER = "tok-planner"
PLAN = {
    "mode": "recommend", "prefill": 3, "decode": 1, "current_prefill": 2, "current_decode": 2,
    "reason": "2P+2D would meet the SLO for 80% of requests", "forecast_rate_per_s": 4.0,
    "predicted_attainment": 0.97, "measured_attainment": 0.8, "usd_per_hour": 12.0,
    "decided_unix_s": 0.0,
}  # fmt: skip


@pytest.fixture(scope="module")
def router():
    with running_router(PDSERVE_ADMIN_TOKENS=f"planner:planner:{PLANNER}") as process:
        yield process


def put(router, model: str, body: dict) -> httpx.Response:
    return httpx.put(f"{router.url}/admin/v1/plans/{model}", json=body, timeout=10,
                     headers={"Authorization": f"Bearer {PLANNER}"})  # fmt: skip


@pytest.mark.parametrize(
    ("change", "param"),
    [({"prefill": 0}, "prefill"), ({"mode": "yolo"}, "mode"), ({"reason": "x" * 501}, "reason"),
     ({"predicted_attainment": 1.5}, "predicted_attainment"), ({"extra": 1}, "extra")],
)  # fmt: skip
def test_a_bad_plan_is_refused_naming_the_field(router, change: dict, param: str) -> None:
    answer = put(router, "m", {**PLAN, **change})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_a_plan_for_an_unserved_model_is_not_found_and_nothing_is_stored(router) -> None:
    answer = put(router, "nobody-serves-this", PLAN)
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
    listed = httpx.get(f"{router.url}/admin/v1/plans", timeout=10,
                       headers={"Authorization": f"Bearer {PLANNER}"})  # fmt: skip
    assert listed.status_code == 200 and listed.json() == {"plans": {}}
