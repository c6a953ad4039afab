"""Placement, route validation, the canary gate and the safety screens, one function each."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from contracts.rollout import ModelArtifact, ModelPolicy, RouteSpec, SloGate
from contracts.safety import SafetyPolicy
from contracts.workers import WorkerRegistration, WorkerRole
from router.errors import InvalidRequest, RequestTooLarge, parsed
from router.rollout.rollout import Rollout
from router.rollout.rollout_control import RolloutControl
from router.rollout.rollout_gate import StageFigures, StageWindows, judge
from router.rollout.safety import Screen, StreamScreen, blocking
from router.state.base import StateLimits
from router.state.memory import MemoryState

CHECKSUM = "sha256:" + "0" * 64


def artifact(version: str, path: Path, **extra: object) -> ModelArtifact:
    fields = {"model_id": "m", "version": version, "artifact": str(path), "max_context": 4096,
              "tokenizer": str(path), "checksum": CHECKSUM, **extra}  # fmt: skip
    return ModelArtifact.model_validate(fields)


def rollout_with(tmp_path: Path, *versions: str) -> Rollout:
    rollout = Rollout()
    for version in versions:
        rollout.load_registry(
            1, rollout.registered(artifact(version, tmp_path), by="t", at_unix_s=0)
        )
    return rollout


def test_the_canary_takes_its_weight_of_keys_and_each_key_keeps_its_side(tmp_path: Path):
    rollout = rollout_with(tmp_path, "v1", "v2")
    spec = RouteSpec.model_validate({"prod": "v1", "canary": {"version": "v2", "weight": 0.1}})
    document = rollout.routed("m", spec)
    rollout.load_routes(1, document)
    first = {f"key-{n}": rollout.place("m", f"key-{n}", "rid").stage for n in range(2000)}
    share = sum(stage == "canary" for stage in first.values()) / len(first)
    assert abs(share - 0.1) <= 0.03
    for key, stage in first.items():
        assert rollout.place("m", key, f"another request of {key}").stage == stage
    assert rollout.place("m", "key-0", "r").version == (
        "v2" if first["key-0"] == "canary" else "v1"
    )


def test_without_a_route_any_version_serves(tmp_path: Path):
    rollout = rollout_with(tmp_path, "v1")
    placement = rollout.place("m", "k", "r")
    assert (placement.stage, placement.version) == ("prod", None)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prod": "v9"}, "prod"),  # an unknown version
        ({"prod": "v1", "canary": {"version": "v2", "weight": 1.5}}, "canary.weight"),
        ({"prod": "v1", "canary": {"version": "v2", "weight": -0.1}}, "canary.weight"),
        ({"prod": "v1", "canary": {"version": "v1", "weight": 0.5}}, "canary.version"),
        ({"prod": "v1", "shadow": {"version": "v7", "sample_rate": 1}}, "shadow.version"),
        ({"prod": "v1", "colour": "red"}, "colour"),
    ],
)
def test_a_bad_route_is_refused_naming_the_field(tmp_path: Path, body: dict, param: str | None):
    rollout = rollout_with(tmp_path, "v1", "v2")
    with pytest.raises(InvalidRequest) as refused:
        rollout.routed("m", parsed(RouteSpec, body))
    assert refused.value.param == param


def test_versions_are_immutable_and_artifacts_must_exist(tmp_path: Path):
    rollout = rollout_with(tmp_path, "v1")
    same = rollout.registered(artifact("v1", tmp_path), by="t", at_unix_s=5)
    assert same["m"]["v1"]["registered_at_unix_s"] == 0  # re-registering the same: a no-op
    with pytest.raises(InvalidRequest) as changed:
        rollout.registered(artifact("v1", tmp_path, max_context=8), by="t", at_unix_s=5)
    assert changed.value.code == "version_immutable"
    with pytest.raises(InvalidRequest) as missing:
        rollout.registered(artifact("v2", tmp_path / "absent"), by="t", at_unix_s=5)
    assert (missing.value.param, missing.value.code) == ("artifact", "artifact_missing")
    remote = artifact("v3", Path("/nowhere"), artifact="hf://org/model")
    assert "v3" in rollout.registered(remote, by="t", at_unix_s=5)["m"]


def test_a_worker_of_a_registered_model_must_serve_a_registered_version(tmp_path: Path):
    rollout = rollout_with(tmp_path, "v1")

    def worker(model: str, version: str | None) -> WorkerRegistration:
        return WorkerRegistration(worker_id="w", role=WorkerRole.COLOCATED, model=model,
                                  model_version=version, engine_url="http://x")  # fmt: skip

    rollout.check_worker(worker("m", "v1"))
    rollout.check_worker(worker("unregistered-model", None))
    for version in ("v2", None):
        with pytest.raises(InvalidRequest) as refused:
            rollout.check_worker(worker("m", version))
        assert refused.value.param == "model_version"


def figures(requests: int, errors: int = 0, ttft: float = 0.1, itl: float = 0.01) -> StageFigures:
    return StageFigures(requests=requests, errors=errors, ttft_p99_s=ttft, itl_p99_s=itl)


def test_the_gate_judges_only_with_enough_requests_and_names_each_breach():
    gate = SloGate(min_requests=10, max_ttft_p99_ratio=1.5, max_error_rate_delta=0.05)
    assert not judge(gate, figures(100), figures(9)).judged
    assert judge(gate, figures(100), figures(10, ttft=0.15)).within
    slow = judge(gate, figures(100), figures(10, ttft=0.16))
    assert slow.judged and not slow.within and slow.breaches[0].startswith("ttft_p99")
    failing = judge(gate, figures(100, errors=1), figures(10, errors=1))
    assert [b.split()[0] for b in failing.breaches] == ["error"]


def test_stage_windows_read_only_their_window():
    now = [0.0]
    windows = StageWindows(max_samples=100, clock=lambda: now[0])
    windows.answered("m", "canary", error=True)
    windows.ttft("m", "canary", 9.0)
    now[0] = 100.0
    windows.answered("m", "canary", error=False)
    windows.ttft("m", "canary", 0.2)
    recent = windows.figures("m", "canary", window_s=50)
    assert (recent.requests, recent.errors, recent.ttft_p99_s) == (1, 0, 0.2)
    assert windows.figures("m", "canary", window_s=500).errors == 1


def policy(**checks: object) -> SafetyPolicy:
    return SafetyPolicy.model_validate({"checks": [checks]})


async def no_hook(*_: object) -> dict:
    raise AssertionError("no hook configured")


def sse(*texts: str) -> bytes:
    return b"".join(
        b"data: " + json.dumps({"choices": [{"index": 0, "text": t}]}).encode() + b"\n\n"
        for t in texts
    )


def test_a_pattern_spanning_stream_events_is_caught_on_the_event_that_completes_it():
    screen = Screen(policy(name="words", blocklist=["forbidden fruit"]), model="m",
                    call_hook=no_hook)  # fmt: skip
    stream = StreamScreen(screen)
    assert stream.feed(sse("the forb")) == []
    hits = stream.feed(sse("idden ", "fruit is"))
    assert blocking(hits) is not None and hits[0].check == "words"
    assert stream.feed(sse(" forbidden fruit again")) == []  # one hit per check per stream


def test_whole_words_only_and_any_case():
    screen = Screen(policy(name="w", blocklist=["bad"]), model="m", call_hook=no_hook)
    assert screen.pattern_hits("input", "a BAD idea")
    assert not screen.pattern_hits("input", "badge")


async def test_a_hook_that_times_out_passes_when_fail_open_and_blocks_when_closed():
    async def slow(*_: object) -> dict:
        await asyncio.sleep(5)
        return {"flagged": False}

    for on_failure, blocked in (("open", False), ("closed", True)):
        screen = Screen(policy(name="h", kind="http", url="http://127.0.0.1:9/x", timeout_s=0.05,
                               on_failure=on_failure), model="m", call_hook=slow)  # fmt: skip
        hits = await screen.check("input", "text")
        assert (blocking(hits) is not None) is blocked


async def test_a_hook_that_flags_queues_its_own_category():
    async def classifier(_: object, payload: dict) -> dict:
        return {"flagged": "pii" in payload["text"], "category": "privacy"}

    screen = Screen(policy(name="h", kind="http", url="http://c/x", action="flag"),
                    model="m", call_hook=classifier)  # fmt: skip
    assert await screen.check("output", "nothing") == []
    (hit,) = await screen.check("output", "has pii")
    assert (hit.action, hit.category, hit.direction) == ("flag", "privacy", "output")


def test_a_pattern_that_does_not_compile_is_refused_naming_it():
    with pytest.raises(ValueError, match="does not compile"):
        ModelPolicy.model_validate({"safety": {"checks": [{"name": "p",
                                    "patterns": ["(unclosed"]}]}})  # fmt: skip


def test_a_word_cut_by_the_lookback_does_not_match_as_a_word_of_its_own():
    screen = Screen(policy(name="w", blocklist=["break"], applies_to="output"), model="m",
                    call_hook=no_hook)  # fmt: skip
    stream = StreamScreen(screen)
    lookback = screen.policy.stream_lookback_chars
    # The kept tail starts at "break" inside "jailbreak": not a word of its own.
    assert stream.feed(sse("jailbreak " + "y" * (lookback - 6))) == []
    assert stream.feed(sse(" and more")) == []
    assert stream.feed(sse(" a break")) != []


def test_blocklist_phrases_match_across_punctuation_and_spacing():
    screen = Screen(policy(name="w", blocklist=["launch codes"]), model="m", call_hook=no_hook)
    assert screen.pattern_hits("input", "the Launch,  CODES!")
    assert not screen.pattern_hits("input", "launch the codes")


async def test_a_change_that_would_overflow_the_state_is_refused_and_the_old_one_stays(
    tmp_path: Path,
):
    state = MemoryState(StateLimits(max_document_bytes=2048))
    control = RolloutControl(state, Rollout(), StageWindows(max_samples=10, clock=lambda: 0.0),
                             wall_clock=lambda: 0.0)  # fmt: skip
    await control.register(artifact("v1", tmp_path), "ops")
    small = {"safety": {"checks": [{"name": "small", "blocklist": ["word0", "word1"]}]}}
    await control.set_policy("m", small, "rev", may_loosen=True)
    words = [f"word{n}" for n in range(500)]
    body = {"safety": {"checks": [{"name": "big", "blocklist": words}]}}
    with pytest.raises(RequestTooLarge):
        await control.set_policy("m", body, "rev", may_loosen=True)
    assert [c.name for c in control.rollout.policy("m").policy.safety.checks] == ["small"]
    (*_, written) = await state.audit(limit=5)
    assert (written.action, written.outcome) == ("set_policy", "ok")  # the refusal: not logged
    assert written.detail["safety_checks"] == ["small"]
    assert "word1" not in str(written.detail)  # the audit keeps check names, not blocklists
