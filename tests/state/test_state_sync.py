"""A re-role settles wherever the worker reports: a worker registering in the role asked of
it is released and its switch cleared, even if the replica that ran the operation died."""

from __future__ import annotations

import time

from contracts.workers import WorkerRegistration, WorkerRole
from router.fleet.pool_control import PoolController
from router.fleet.registry import WorkerRegistry
from router.fleet.scalers import configured_scaler
from router.fleet.state_sync import CONTROL_DOCUMENT, StateSync
from router.scheduling.load import InFlightLoad
from router.settings import ControlSettings
from router.state.base import Change
from router.state.memory import MemoryState


def registration(role: WorkerRole, incarnation: int) -> WorkerRegistration:
    return WorkerRegistration(worker_id="w", role=role, model="m", engine_url="http://e",
                              incarnation=incarnation)  # fmt: skip


def replica(state: MemoryState) -> tuple[WorkerRegistry, PoolController, StateSync]:
    registry = WorkerRegistry(heartbeat_timeout_s=10, forget_after_s=300, max_workers=8)
    sync: StateSync
    settings = ControlSettings()
    pools = PoolController(
        settings, registry=registry, state=state,
        publish=lambda wanted: sync.publish_control(wanted),
        scaler=configured_scaler(settings, registry=registry, load=InFlightLoad(),
                                 blocks_held=lambda w: 0, clock=time.monotonic),
    )  # fmt: skip
    sync = StateSync(
        state, registry=registry, record_ttl_s=300, on_registered=lambda r, new: None,
        on_gone=lambda w: None, on_control=pools.adopt, settled=pools.settled,
        wanted=pools.wanted,
    )  # fmt: skip
    return registry, pools, sync


async def test_a_worker_back_in_its_new_role_is_released_on_every_replica():
    state = MemoryState()
    registry, pools, sync = replica(state)
    registry.register(registration(WorkerRole.PREFILL, 1), now_s=0.0)
    registry.hold("w")
    pools.adopt({"w": WorkerRole.DECODE})  # an operation elsewhere asked w to switch
    await sync.publish_control(pools.wanted())

    back = registration(WorkerRole.DECODE, 2).model_dump(mode="json")
    await state.put_worker("w", {"registration": back, "heartbeat": None}, ttl_s=300)
    await sync.apply(Change("worker", "w"))

    assert registry.get("w").role is WorkerRole.DECODE
    assert pools.wanted_role("w") is None and not registry.is_held("w")
    _, shared = await state.document(CONTROL_DOCUMENT)
    assert shared == {"held": [], "wanted": {}}


async def test_a_worker_back_in_its_old_role_stays_held():
    state = MemoryState()
    registry, pools, sync = replica(state)
    registry.register(registration(WorkerRole.PREFILL, 1), now_s=0.0)
    registry.hold("w")
    pools.adopt({"w": WorkerRole.DECODE})
    await sync.registered(registration(WorkerRole.PREFILL, 2))  # its engine restarted as is
    assert pools.wanted_role("w") is WorkerRole.DECODE and registry.is_held("w")
