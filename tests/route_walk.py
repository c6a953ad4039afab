"""What the real rollout tests share: an operator's admin calls, registering versions
with their checksums, and the walk of a model's route (prod alone, a 50% canary kept by
user, a promotion) checked against each version's own answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from localrun.cluster import LocalCluster
from modelstore.checksum import folder_checksum
from router.rollout.rollout import share_of

OPERATOR = "rollout-operator"
ROUTER_ENV = {"PDSERVE_ADMIN_TOKENS": f"sre:operator:{OPERATOR}"}
Answer = TypeVar("Answer")


def admin(cluster: LocalCluster, method: str, path: str, body: dict | None = None) -> Any:
    answer = httpx.request(method, cluster.router_url + path, json=body, timeout=30,
                           headers={"Authorization": f"Bearer {OPERATOR}"})  # fmt: skip
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def register(cluster: LocalCluster, model: str, paths: dict[str, Path], max_context: int) -> None:
    for version, path in paths.items():
        admin(cluster, "POST", "/admin/v1/models", {
            "model_id": model, "version": version, "artifact": str(path),
            "max_context": max_context, "tokenizer": str(path),
            "checksum": folder_checksum(path),
        })  # fmt: skip


def walk_route(
    cluster: LocalCluster, model: str, answer: Callable[[str], Answer],
    reference: dict[str, Answer], matches: Callable[[Answer, Answer], bool],
) -> None:  # fmt: skip
    """``answer(user)``: the router's answer for that user; ``reference``: v1's and v2's."""
    route = f"/admin/v1/routes/{model}"
    admin(cluster, "PUT", route, {"prod": "v1"})
    assert matches(answer("anyone"), reference["v1"])
    admin(cluster, "PUT", route, {
        "prod": "v1", "canary": {"version": "v2", "weight": 0.5, "stickiness": "user"},
        "gate": {"min_requests": 1, "max_ttft_p99_ratio": 1000, "max_itl_p99_ratio": 1000},
    })  # fmt: skip
    users = [f"user-{n}" for n in range(8)]
    sides = {user: "v2" if share_of(model, user) < 0.5 else "v1" for user in users}
    assert set(sides.values()) == {"v1", "v2"}
    for user in users:
        assert matches(answer(user), reference[sides[user]]), user
    promoted = admin(cluster, "POST", f"{route}/promote")  # through the canary's gate
    assert promoted["prod"] == "v2"
    for user in users[:3]:
        assert matches(answer(user), reference["v2"]), user
