import pytest

from contracts.workers import WorkerHeartbeat, WorkerRegistration, WorkerRole
from router.fleet.circuit_breaker import CircuitState
from router.fleet.registry import RegistryFull, WorkerRegistry


def registry(max_workers=8, serve_degraded=True):
    return WorkerRegistry(heartbeat_timeout_s=10, forget_after_s=60, max_workers=max_workers,
                          serve_degraded=serve_degraded)  # fmt: skip


def registration(worker_id="p0", role=WorkerRole.PREFILL, incarnation=1):
    return WorkerRegistration(
        worker_id=worker_id, role=role, model="m", engine_url="http://e",
        incarnation=incarnation,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("probes", "healthy"),
    [
        ([False], True),
        ([False, False], True),
        ([False, False, False], False),
        ([False, False, True, False, False], True),
        ([False, False, False, True], True),
    ],
)
def test_a_worker_leaves_rotation_only_after_consecutive_failed_probes(probes, healthy):
    reg = registry()
    reg.register(registration(), now_s=0)
    for passed in probes:
        reg.record_probe("p0", passed, failures_to_eject=3)
    assert [w.worker_id for w in reg.eligible("m", WorkerRole.PREFILL, 1)] == (
        ["p0"] if healthy else []
    )


def test_an_unreachable_engine_opens_the_circuit_at_once_and_a_trial_closes_it():
    reg = registry()
    reg.register(registration(), now_s=0)
    assert reg.request_failed("p0", 1, at_once=True)
    assert reg.eligible("m", WorkerRole.PREFILL, 1) == []
    assert reg.eligible("m", WorkerRole.PREFILL, 5.9) == [], "open for circuit_open_s"
    reg.record_probe("p0", False, failures_to_eject=3)
    assert reg.eligible("m", WorkerRole.PREFILL, 6.5) == [], "no trial while its probe fails"
    reg.record_probe("p0", True, failures_to_eject=3)
    assert len(reg.eligible("m", WorkerRole.PREFILL, 6.5)) == 1, "half-open: a trial"
    assert reg.request_succeeded("p0", 6.6)
    assert reg.get("p0").breaker.state(6.6) is CircuitState.CLOSED


def test_a_new_incarnation_starts_with_its_circuit_closed():
    reg = registry()
    reg.register(registration(), now_s=0)
    reg.request_failed("p0", 1, at_once=True)
    reg.register(registration(), now_s=2)
    assert len(reg.eligible("m", WorkerRole.PREFILL, 2)) == 1


@pytest.mark.parametrize(
    ("beat", "now_s", "eligible"),
    [
        ({"ready": True}, 5, True),
        ({"ready": True}, 10.5, False),  # heartbeat older than the timeout
        ({"ready": False}, 5, False),
        ({"ready": True, "draining": True}, 5, False),
    ],
)
def test_eligibility_follows_the_latest_heartbeat(beat, now_s, eligible):
    reg = registry()
    reg.register(registration(), now_s=0)
    assert reg.heartbeat(WorkerHeartbeat(worker_id="p0", incarnation=1, **beat), now_s=0)
    assert bool(reg.eligible("m", WorkerRole.PREFILL, now_s)) is eligible


def test_heartbeats_from_other_incarnations_are_not_applied():
    reg = registry()
    reg.register(registration(incarnation=2), now_s=0)
    stale = WorkerHeartbeat(worker_id="p0", ready=False, incarnation=1)
    newer = WorkerHeartbeat(worker_id="p0", ready=True, incarnation=3)
    assert reg.heartbeat(stale, now_s=1) is True  # ignored
    assert reg.eligible("m", WorkerRole.PREFILL, 1)
    assert reg.heartbeat(newer, now_s=1) is False  # must re-register first
    assert reg.heartbeat(WorkerHeartbeat(worker_id="ghost", ready=True), now_s=1) is False


def test_capacity_is_bounded_and_silent_workers_are_forgotten():
    reg = registry(max_workers=1)
    reg.register(registration("p0"), now_s=0)
    with pytest.raises(RegistryFull):
        reg.register(registration("p1"), now_s=0)
    reg.register(registration("p0"), now_s=0)  # re-registering is not growth
    assert reg.forget_silent(now_s=61) == ["p0"]
    assert reg.workers() == []


P, D, C = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.COLOCATED


@pytest.mark.parametrize(
    ("roles", "held", "whole_path"),
    [
        ([P], (), False),
        ([D], (), False),
        ([P, P], (), False),
        ([P, D], (), True),
        ([C], (), True),
        ([P, D], ("w1",), False),  # the decode is held out of rotation
        ([P, D, C], ("w1",), True),  # the colocated one still serves
    ],
)
@pytest.mark.parametrize("serve_degraded", [False, True])
def test_a_model_is_servable_with_a_whole_path_or_one_pool_left(
    roles, held, whole_path, serve_degraded
):
    reg = registry(serve_degraded=serve_degraded)
    for index, role in enumerate(roles):
        reg.register(registration(f"w{index}", role), now_s=0)
    for worker_id in held:
        reg.hold(worker_id)
    # Degraded: any ready worker serves its model whole.
    assert reg.servable_models(now_s=1) == (["m"] if whole_path or serve_degraded else [])
    assert reg.models() == ["m"]  # registered all the same: a 503 to retry, not a 404


@pytest.mark.parametrize(("roles", "left"), [([P, P], P), ([D], D), ([P, D], None), ([D, C], None)])
def test_the_pool_left_of_a_pd_model_is_served_as_a_colocated_one(roles, left):
    reg = registry()
    for index, role in enumerate(roles):
        reg.register(registration(f"w{index}", role), now_s=0)
    pools = reg.pools("m", now_s=1)
    assert pools.degraded is left
    if left is not None:
        assert (pools.prefill, pools.decode) == ([], [])
        assert {w.role for w in pools.colocated} == {left} and pools.first_hop == pools.colocated
    strict = registry(serve_degraded=False)
    for index, role in enumerate(roles):
        strict.register(registration(f"w{index}", role), now_s=0)
    assert (
        strict.pools("m", now_s=1) == reg.pools("m", now_s=1)
        if left is None
        else (
            strict.pools("m", now_s=1).degraded is None and not strict.pools("m", now_s=1).colocated
        )
    )


def test_a_silent_path_is_not_servable():
    reg = registry()
    reg.register(registration("p0", P), now_s=0)
    reg.register(registration("d0", D), now_s=0)
    assert reg.servable_models(now_s=5) == ["m"]
    assert reg.servable_models(now_s=11) == []  # past heartbeat_timeout_s
