"""A canary's pre-pull (router/rollout/prepull.py, agent's side in modelstore.pull):
which workers pull, what each is told, and when the canary may have traffic."""

from __future__ import annotations

import json
from pathlib import Path

from contracts.rollout import RouteSpec
from contracts.workers import WorkerHeartbeat, WorkerRegistration, WorkerRole
from modelstore.pull import pulled_versions
from router.fleet.registry import WorkerRegistry
from router.rollout.prepull import chosen_workers, gate_open, pull_order, pulled_count
from router.rollout.rollout import Rollout

MODEL = "m"


def fleet(pulled: dict[str, tuple[str, ...]]) -> WorkerRegistry:
    """Workers of MODEL (and one of another model), each with the versions it reports."""
    registry = WorkerRegistry(heartbeat_timeout_s=10, forget_after_s=60, max_workers=16)
    for worker_id, versions in {**pulled, "other-0": ("v2",)}.items():
        model = "other" if worker_id.startswith("other") else MODEL
        registration = WorkerRegistration(
            worker_id=worker_id, role=WorkerRole.DECODE, model=model, engine_url="http://h:1"
        )
        registry.register(registration, 0.0)
        beat = WorkerHeartbeat(worker_id=worker_id, ready=True, pulled_versions=versions)
        registry.heartbeat(beat, 0.0)
    return registry


def checksum(version: str) -> str:
    return "sha256:" + version.encode().hex().ljust(64, "0")


def rollout(prepull_workers: int) -> Rollout:
    plan = Rollout()
    plan.load_registry(1, {MODEL: {
        v: {"model_id": MODEL, "version": v, "artifact": f"/store/{v}", "max_context": 10,
            "tokenizer": f"/store/{v}", "checksum": checksum(v),
            "registered_at_unix_s": 0.0, "registered_by": "sre"}
        for v in ("v1", "v2")}})  # fmt: skip
    spec = RouteSpec(prod="v1", canary={"version": "v2", "weight": 0.5,
                                        "prepull_workers": prepull_workers})  # fmt: skip
    plan.load_routes(1, {MODEL: {"spec": spec.model_dump(mode="json")}})
    return plan


def test_the_chosen_are_those_that_have_it_then_a_stable_hash_order():
    workers = fleet({f"w{i}": () for i in range(6)}).workers()
    first = chosen_workers(MODEL, "v2", workers, 2)
    assert len(first) == 2 and first == chosen_workers(MODEL, "v2", reversed(workers), 2)
    have_it = fleet({**{f"w{i}": () for i in range(6)}, "w5": ("v2",)}).workers()
    assert "w5" in chosen_workers(MODEL, "v2", have_it, 2)
    # One chosen worker leaves: the other stays chosen, and one more is chosen.
    gone = sorted(first)[0]
    rest = [w for w in workers if w.worker_id != gone]
    assert sorted(first)[1] in chosen_workers(MODEL, "v2", rest, 2)


def test_only_the_chosen_without_the_version_are_told_to_pull_it():
    registry = fleet({"w0": (), "w1": (), "w2": (), "w3": ("v2",)})
    plan, workers = rollout(prepull_workers=2), registry.workers()
    orders = {w.worker_id: pull_order(plan, w, lambda: workers) for w in workers}
    told = {worker_id: order for worker_id, order in orders.items() if order is not None}
    assert len(told) == 1 and "w3" not in told  # w3 has it; one more is chosen
    (order,) = told.values()
    assert (order.version, order.artifact, order.checksum) == ("v2", "/store/v2", checksum("v2"))
    assert all(pull_order(rollout(0), w, lambda: workers) is None for w in workers)


def test_the_canary_gets_traffic_once_enough_workers_of_its_model_have_it():
    spec = rollout(prepull_workers=2).route(MODEL).spec
    one = fleet({"w0": ("v2",), "w1": ("v1",)}).workers()  # other-0 has v2 but is not m's
    assert pulled_count(MODEL, "v2", one) == 1 and not gate_open(spec, MODEL, lambda: one)
    two = fleet({"w0": ("v2",), "w1": ("v1", "v2")}).workers()
    assert gate_open(spec, MODEL, lambda: two)
    assert gate_open(rollout(prepull_workers=0).route(MODEL).spec, MODEL, list)


def test_an_agent_reports_only_versions_a_pull_placed_beside_its_own(tmp_path: Path):
    cache = tmp_path / "m"
    for version in ("v1", "v2", "v3"):
        (cache / version).mkdir(parents=True)
    for version in ("v1", "v2", "gone"):  # "gone": a record whose folder was removed
        (cache / f".{version}.pull.json").write_text(json.dumps({"copy_s": 0}))
    assert pulled_versions(cache / "v1") == ("v1", "v2")
    assert pulled_versions(cache / "v3") == ()  # not placed by a pull: no cache to speak of
