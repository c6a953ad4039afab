"""A model's policy holds against operators: routes, deletion and promotion keep to it,
and only a reviewer loosens it (``RolloutControl`` on the in-memory state)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.rollout import Approval, ModelPolicy
from router.errors import Forbidden
from router.rollout.rollout import Rollout
from router.rollout.rollout_control import RolloutControl
from router.rollout.rollout_gate import StageWindows
from router.state.memory import MemoryState
from tests.unit.test_rollout import artifact

CHECK = {"name": "no-secrets", "blocklist": ["launch codes"]}
STRICT = {"requires_approval": True, "max_unapproved_canary_weight": 0.1,
          "safety": {"checks": [CHECK]}}  # fmt: skip


def policy(**fields: object) -> ModelPolicy:
    return ModelPolicy.model_validate({**STRICT, **fields})


@pytest.mark.parametrize(
    ("fields", "looser"),
    [
        ({}, []),
        ({"max_unapproved_canary_weight": 0.0}, []),  # stricter
        ({"safety": {"checks": [CHECK, {"name": "more", "patterns": ["x"]}]}}, []),
        ({"requires_approval": False}, ["requires_approval turned off"]),
        ({"max_unapproved_canary_weight": 0.5}, ["max_unapproved_canary_weight raised"]),
        ({"safety": {"checks": []}}, ["safety check 'no-secrets' removed or changed"]),
        ({"safety": {"checks": [{**CHECK, "action": "flag"}]}},
         ["safety check 'no-secrets' removed or changed"]),
        ({"safety": {"checks": [CHECK], "keep_prompt": True}},
         ["safety settings changed (keep_prompt, retention, lookback)"]),
    ],
)  # fmt: skip
def test_what_loosens_a_policy(fields: dict, looser: list[str]):
    assert policy().loosened_by(policy(**fields)) == looser


@pytest.fixture
async def control(tmp_path: Path) -> RolloutControl:
    now = [0.0]
    windows = StageWindows(max_samples=100, clock=lambda: now[0])
    control = RolloutControl(MemoryState(), Rollout(), windows, wall_clock=lambda: 0.0)
    for version in ("v1", "v2"):
        await control.register(artifact(version, tmp_path), "ops")
    await control.set_policy("m", STRICT, "rev", may_loosen=True)
    return control


async def refused(change: object, code: str) -> None:
    with pytest.raises(Forbidden) as error:
        await change  # type: ignore[misc]
    assert error.value.code == code


async def test_an_operator_cannot_route_prod_to_an_unapproved_version(control):
    await refused(control.set_route("m", {"prod": "v2"}, "ops"), "approval_required")
    assert control.rollout.route("m") is None
    await control.approve("m", Approval(version="v1"), "rev")
    await control.set_route("m", {"prod": "v1"}, "ops")
    # A light canary may be unapproved; a heavy one may not.
    light = {"prod": "v1", "canary": {"version": "v2", "weight": 0.1}}
    heavy = {"prod": "v1", "canary": {"version": "v2", "weight": 0.5}}
    await control.set_route("m", light, "ops")
    await refused(control.set_route("m", heavy, "ops"), "approval_required")
    assert control.rollout.route("m").spec.canary.weight == 0.1


async def test_without_a_route_only_approved_versions_serve(control):
    assert control.rollout.place("m", "k", "r").version == frozenset()
    await control.approve("m", Approval(version="v1"), "rev")
    await control.set_route("m", {"prod": "v1"}, "ops")
    await control.delete_route("m", "ops")
    assert control.rollout.place("m", "k", "r").version == frozenset({"v1"})
    await control.approve("m", Approval(version="v1", decision="refuse"), "rev")
    assert control.rollout.place("m", "k", "r").version == frozenset()


async def test_an_operator_may_tighten_the_policy_but_not_loosen_it(control):
    tighter = {**STRICT, "max_unapproved_canary_weight": 0.0}
    await control.set_policy("m", tighter, "ops", may_loosen=False)
    await refused(control.set_policy("m", {}, "ops", may_loosen=False), "reviewer_required")
    assert control.rollout.policy("m").policy.requires_approval
    await control.set_policy("m", {}, "rev", may_loosen=True)
    assert not control.rollout.policy("m").policy.requires_approval
    audit = await control._state.audit(limit=10)
    done = [(e.actor, e.action, e.outcome.split(":")[0], e.detail.get("loosened")) for e in audit]
    looser = ["requires_approval turned off", "max_unapproved_canary_weight raised",
              "safety check 'no-secrets' removed or changed"]  # fmt: skip
    assert ("rev", "set_policy", "ok", looser) in done
    assert not [entry for entry in done if entry[2] != "ok"]  # a refusal changes nothing


async def test_a_route_is_not_deleted_while_unapproved_versions_have_workers(control):
    await control.approve("m", Approval(version="v1"), "rev")
    await control.set_route("m", {"prod": "v1"}, "ops")
    deleting = control.delete_route("m", "ops", frozenset({"v1", "v2"}))
    await refused(deleting, "approval_required")
    assert control.rollout.route("m") is not None
    await control.delete_route("m", "ops", frozenset({"v1"}))
    assert control.rollout.route("m") is None
