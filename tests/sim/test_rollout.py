"""Versions in production on a sim cluster of its own: one colocated worker per version of
the model (v1, v2, v3), the registry, routes, canary stickiness, promotion with a
reviewer's approval, the gate's automatic rollback, shadow traffic that never touches
the client, and the safety policy's blocks and flags. Real HTTP throughout."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.main import main as cli_main
from contracts.agent_tokens import agent_token
from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster, VersionWorkers
from modelstore import tiny_llama
from modelstore.checksum import folder_checksum
from router.rollout.rollout import share_of
from tests.clusters import small_sim_cluster
from tests.conditions import wait_for
from tests.sim.faults import set_faults

MODEL = tiny_llama.SERVED_NAME
OPERATOR, REVIEWER = "operator-token-0123456789", "reviewer-token-0123456789"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path = tiny_llama.ensure()
    with small_sim_cluster(
        tmp_path_factory.mktemp("rollout"), prefill=0, decode=0, colocated=1,
        model_version="v1",
        versions=(VersionWorkers(version="v2", model_path=path),
                  VersionWorkers(version="v3", model_path=path)),
        router_env={
            "PDSERVE_ADMIN_TOKENS": f"ops:operator:{OPERATOR},rev:reviewer:{REVIEWER}",
            "PDSERVE_GATE_CHECK_INTERVAL_S": "0.5", "PDSERVE_SHADOW_TIMEOUT_S": "6",
            # The hung shadow's copies pass this within the shadow test: some are shed
            # whatever the engine's queue looked like when a heartbeat sampled it.
            "PDSERVE_SHADOW_MAX_INFLIGHT": "4",
        },
    ) as local:  # fmt: skip
        yield local


def admin(cluster: LocalCluster, method: str, path: str, body: dict | None = None,
          token: str = OPERATOR) -> httpx.Response:  # fmt: skip
    return httpx.request(method, cluster.router_url + path, json=body, timeout=30,
                         headers={"Authorization": f"Bearer {token}"})  # fmt: skip


def complete(cluster: LocalCluster, *, user: str = "", stream: bool = False,
             prompt: str = "Hello there", **extra: object) -> httpx.Response:  # fmt: skip
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
            "stream": stream, **({"user": user} if user else {}), **extra}  # fmt: skip
    return httpx.post(cluster.router_url + "/v1/completions", json=body, timeout=60)


def routed(cluster: LocalCluster) -> dict[str, float]:
    families = scrape(cluster.router_url + "/metrics")
    return {w.name: total(families, "pdserve_routed_requests_total", worker=w.name)
            for w in cluster.workers}  # fmt: skip


def route(cluster: LocalCluster) -> dict:
    return admin(cluster, "GET", f"/admin/v1/routes/{MODEL}").json()


def register(cluster: LocalCluster, version: str, **changes: object) -> httpx.Response:
    path = str(tiny_llama.ensure())
    body = {"model_id": MODEL, "version": version, "artifact": path, "max_context": 4096,
            "tokenizer": path, "checksum": folder_checksum(Path(path)), **changes}  # fmt: skip
    return admin(cluster, "POST", "/admin/v1/models", body)


def assert_refused(response: httpx.Response, status: int, param: str | None, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error


def test_the_registry_holds_immutable_versions_and_routes_name_only_registered_ones(cluster):
    for version in ("v1", "v2", "v3"):
        assert register(cluster, version).status_code == 201
    assert register(cluster, "v1").status_code == 201  # the same again: a no-op
    assert_refused(register(cluster, "v1", max_context=8), 400, "version", "version_immutable")
    workers = admin(cluster, "GET", "/admin/workers", token=cluster.admin_token).json()["workers"]
    assert {w["model_checksum"] for w in workers} == {folder_checksum(tiny_llama.ensure())}
    # Each agent timed its fresh engine's prefill (a warm-up, then three sizes twice, the
    # largest capped by the context window; a sim is fast enough for all within the budget).
    for worker in workers:
        small, medium, large, *again = worker["prefill_probe"]
        assert len(again) == 3 and small[0] < medium[0] < large[0], worker["prefill_probe"]
        assert all(seconds > 0 for _, seconds in worker["prefill_probe"])
    assert_refused(register(cluster, "v4", artifact="/no/such/model"), 400, "artifact",
                   "artifact_missing")  # fmt: skip
    listed = {m["version"]: m for m in admin(cluster, "GET", "/admin/v1/models").json()["models"]}
    assert set(listed) == {"v1", "v2", "v3"} and listed["v2"]["ready_workers"] == 1
    # Clients see the model id, never a version.
    served = httpx.get(cluster.router_url + "/v1/models").json()["data"]
    assert [m["id"] for m in served] == [MODEL]

    assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v1"}).status_code == 200
    for body, param, code in (
        ({"prod": "v9"}, "prod", "unknown_version"),
        ({"prod": "v1", "canary": {"version": "v2", "weight": 1.5}}, "canary.weight", None),
        ({"prod": "v1", "canary": {"version": "v1", "weight": 0.5}}, "canary.version",
         "stage_is_prod"),
        ({"prod": "v1", "shadow": {"version": "v8", "sample_rate": 1}}, "shadow.version",
         "unknown_version"),
    ):  # fmt: skip
        assert_refused(admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", body), 400, param, code)
        assert route(cluster)["spec"]["prod"] == "v1" and route(cluster)["spec"]["canary"] is None
    # A worker claiming a version the registry does not hold is refused.
    registration = {"worker_id": "stray", "role": "colocated", "model": MODEL,
                    "model_version": "v9", "engine_url": "http://127.0.0.1:9"}  # fmt: skip
    stray = agent_token(cluster.agent_secret, "stray")
    refused = admin(cluster, "POST", "/admin/workers/register", registration, stray)
    assert_refused(refused, 400, "model_version", "unknown_version")
    # ... and so is one whose files are not the version's.
    other_files = {**registration, "model_version": "v1", "model_checksum": "sha256:" + "0" * 64}
    refused = admin(cluster, "POST", "/admin/workers/register", other_files, stray)
    assert_refused(refused, 400, "model_checksum", "checksum_mismatch")


def test_the_canary_serves_its_keys_and_every_key_stays_on_its_side(cluster):
    body = {"prod": "v1", "canary": {"version": "v2", "weight": 0.3, "stickiness": "user"}}
    assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", body).status_code == 200
    before = routed(cluster)
    users = [f"user-{n}" for n in range(40)]
    for user in users * 2:
        assert complete(cluster, user=user).status_code == 200
    after = routed(cluster)
    on_canary = sum(share_of(MODEL, user) < 0.3 for user in users)
    assert 0 < on_canary < len(users)
    assert after["v2-colocated-0"] - before["v2-colocated-0"] == 2 * on_canary
    assert after["colocated-0"] - before["colocated-0"] == 2 * (len(users) - on_canary)
    stages = scrape(cluster.router_url + "/metrics")
    assert total(stages, "pdserve_requests_total", route_stage="canary") >= 2 * on_canary
    (status,) = admin(cluster, "GET", "/admin/v1/status").json()["models"]
    assert status["route"] == "prod v1 · canary v2 30%"
    assert sorted(w["version"] for w in status["workers"]) == ["v1", "v2", "v3"]


def test_an_operator_cannot_ship_an_unapproved_version_by_any_route(cluster):
    """The operator's ways to v2 under a policy that requires approval: put it in prod,
    drop the route, promote it from a canary. Each is a 403 that changes nothing, and
    nothing serves v2; a reviewer's approval then lets the promotion through."""
    policy = f"/admin/v1/policies/{MODEL}"
    strict = {"requires_approval": True, "max_unapproved_canary_weight": 0.0}
    # An operator may tighten the policy, but only a reviewer may approve v1 to serve.
    assert admin(cluster, "PUT", policy, strict).status_code == 200
    assert_refused(admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v1"}), 403,
                   "prod", "approval_required")  # fmt: skip
    approve = f"/admin/v1/routes/{MODEL}/approve"
    assert admin(cluster, "POST", approve, {"version": "v1"}, REVIEWER).status_code == 200
    assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v1"}).status_code == 200
    v2_before = routed(cluster)["v2-colocated-0"]

    assert_refused(admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v2"}), 403,
                   "prod", "approval_required")  # fmt: skip
    assert_refused(admin(cluster, "DELETE", f"/admin/v1/routes/{MODEL}"), 403, None,
                   "approval_required")  # fmt: skip
    heavy = {"prod": "v1", "canary": {"version": "v2", "weight": 0.5, "stickiness": "user"},
             "gate": {"min_requests": 3, "window_s": 30, "max_ttft_p99_ratio": 50}}  # fmt: skip
    assert_refused(admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", heavy), 403,
                   "canary.version", "approval_required")  # fmt: skip
    weightless = {**heavy, "canary": {**heavy["canary"], "weight": 0.0}}
    assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", weightless).status_code == 200
    assert_refused(admin(cluster, "POST", f"/admin/v1/routes/{MODEL}/promote"), 403, "prod",
                   "approval_required")  # fmt: skip
    # Loosening the policy is not the operator's either.
    assert_refused(admin(cluster, "PUT", policy, {}), 403, None, "reviewer_required")
    for n in range(12):
        assert complete(cluster, user=f"tries-{n}").status_code == 200
    assert routed(cluster)["v2-colocated-0"] == v2_before  # nothing served v2
    assert route(cluster)["spec"]["prod"] == "v1"

    # Approving is the reviewer's duty: neither the operator nor an admin token may.
    approval = {"version": "v2", "decision": "approve", "note": "read the eval"}
    for token in (OPERATOR, cluster.admin_token):
        assert_refused(admin(cluster, "POST", approve, approval, token), 403, None,
                       "insufficient_scope")  # fmt: skip
    approved = admin(cluster, "POST", approve, approval, REVIEWER)
    assert approved.status_code == 200 and approved.json()["approvals"]["v2"]["by"] == "rev"
    assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", heavy).status_code == 200
    for n in range(30):
        assert complete(cluster, user=f"promote-{n}").status_code == 200
    assert route(cluster)["gate_verdict"]["within"], route(cluster)["gate_verdict"]
    promoted = admin(cluster, "POST", f"/admin/v1/routes/{MODEL}/promote")
    assert promoted.status_code == 200, promoted.text
    assert route(cluster)["spec"]["prod"] == "v2" and route(cluster)["spec"]["canary"] is None
    audit = admin(cluster, "GET", "/admin/v1/audit?limit=50").json()["entries"]
    done = [(e["actor"], e["action"], e["outcome"]) for e in audit]
    assert ("ops", "promote", "ok") in done and ("rev", "approve", "ok") in done
    assert {outcome for _, _, outcome in done} == {"ok"}  # the refusals changed nothing
    # The reviewer puts the default policy back for the tests after this one.
    assert admin(cluster, "PUT", policy, {}, REVIEWER).status_code == 200


def test_a_canary_that_breaches_its_gate_is_rolled_back_by_itself(cluster):
    set_faults(cluster, "colocated-0", slowdown=60.0)  # v1, now the canary
    try:
        body = {"prod": "v2", "canary": {"version": "v1", "weight": 0.5, "stickiness": "user"},
                "gate": {"min_requests": 3, "window_s": 20, "max_ttft_p99_ratio": 3}}  # fmt: skip
        assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", body).status_code == 200
        for n in range(16):
            if route(cluster)["spec"]["canary"] is None:
                break
            complete(cluster, user=f"gate-{n}")
        wait_for(lambda: route(cluster)["spec"]["canary"] is None, 30, "the gate's rollback")
    finally:
        set_faults(cluster, "colocated-0", slowdown=1.0)
    audit = admin(cluster, "GET", "/admin/v1/audit?limit=50").json()["entries"]
    rollback = [e for e in audit if e["action"] == "rollback" and e["actor"] == "gate"]
    assert rollback and "ttft_p99" in rollback[-1]["detail"]["why"]
    families = scrape(cluster.router_url + "/metrics")
    assert total(families, "pdserve_canary_rollbacks_total", model=MODEL) == 1


def _latencies(cluster: LocalCluster, n: int, tag: str) -> tuple[list[float], list[int]]:
    latencies, statuses = [], []
    for i in range(n):
        started = time.monotonic()
        statuses.append(complete(cluster, user=f"{tag}-{i}", prompt=f"{tag} {i}").status_code)
        latencies.append(time.monotonic() - started)
    return latencies, statuses


def _shadow_engine_idle(cluster: LocalCluster) -> bool:
    workers = cluster.admin("GET", "/admin/v1/pools")["models"][MODEL]["workers"]
    (shadow,) = [w for w in workers if w["worker_id"] == "v3-colocated-0"]
    return (
        shadow["state"] == "ready"
        and not shadow["engine_waiting"]
        and not (shadow["engine_running"])
    )


def test_a_slow_or_dead_shadow_never_reaches_the_client(cluster):
    """One run, shadow off then on: the client's latency and errors do not move while the
    shadow, slowed 25x and then hung, takes far longer or never answers."""
    for version in ("v2", "v3"):  # a no-op after the registry test; needed when run alone
        assert register(cluster, version).status_code == 201
    assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v2"}).status_code == 200
    off, off_statuses = _latencies(cluster, 12, "off")
    shadowed = {"prod": "v2", "shadow": {"version": "v3", "sample_rate": 1.0}}
    try:
        set_faults(cluster, "v3-colocated-0", slowdown=25.0)
        assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", shadowed).status_code == 200
        on, on_statuses = _latencies(cluster, 12, "slow")
        # A copy is shed while the shadow's engine has a queue (by design): the slow copies
        # above may still fill it, so the streamed requests go once the router sees it idle.
        wait_for(lambda: _shadow_engine_idle(cluster), 90, "the shadow's engine idle")
        streamed = [complete(cluster, prompt=f"streamed {i}", stream=True) for i in range(4)]
        assert all(s.status_code == 200 and "[DONE]" in s.text for s in streamed)
        shadow = f"/admin/v1/routes/{MODEL}/shadow"
        wait_for(lambda: any(r["prod_streamed"] and r["outcome"] == "ok" for r in
                             admin(cluster, "GET", shadow).json()["records"]), 30,
                 "a streamed request's shadow comparison")  # fmt: skip
        set_faults(cluster, "v3-colocated-0", hang=True)
        ended_before = _ended_copies(cluster, shadow)
        hung, hung_statuses = _latencies(cluster, 6, "hung")
        # The hung shadow's copies end: at the shadow timeout, or sooner, failed over when
        # the stall check finds its engine hung and ejects it.
        wait_for(lambda: _ended_copies(cluster, shadow) > ended_before, 30,
                 "the hung shadow's copies to end")  # fmt: skip
    finally:  # a hung engine would hold the cluster's stop until its agent kills it
        set_faults(cluster, "v3-colocated-0", hang=False, slowdown=1.0)

    assert set(off_statuses) == set(on_statuses) == set(hung_statuses) == {200}
    records = admin(cluster, "GET", shadow).json()["records"]
    done = [r for r in records if r["outcome"] == "ok"]
    assert done, [(r["outcome"], r["status"], r["latency_s"]) for r in records]
    # Each mirrored answer took far longer than any client waited: nobody waited for it.
    assert min(r["latency_s"] for r in done) > 2 * max(on)
    assert all(r["prod_latency_s"] < r["latency_s"] for r in done)
    # Same weights, greedy: the same text, whether the client's answer was streamed or not.
    assert all(r["same_text"] is True for r in done)
    assert statistics.median(on + hung) < 3 * statistics.median(off) + 0.05
    families = scrape(cluster.router_url + "/metrics")
    assert total(families, "pdserve_shadow_requests_total", outcome="shed") >= 1


def _ended_copies(cluster, shadow: str) -> int:
    records = admin(cluster, "GET", shadow).json()["records"]
    return sum(r["outcome"] in ("timeout", "error") for r in records)


POLICY = {
    "checks": [
        {"name": "no-secrets", "category": "secrets", "blocklist": ["launch codes"],
         "applies_to": "input"},
        {"name": "watch", "category": "curiosity", "action": "flag",
         "patterns": [r"\bsuspicious\b"], "applies_to": "input"},
        # The sim's output is random vocabulary: a long enough run of output blocks.
        {"name": "long-output", "category": "length", "patterns": [r"(?s).{24}"],
         "applies_to": "output"},
    ]
}  # fmt: skip


def test_the_safety_policy_blocks_and_flags_without_leaking_text(cluster):
    # Adding checks tightens the policy: an operator may.
    assert admin(cluster, "PUT", f"/admin/v1/routes/{MODEL}", {"prod": "v2"}).status_code == 200
    changed = admin(cluster, "PUT", f"/admin/v1/policies/{MODEL}", {"safety": POLICY})
    assert changed.status_code == 200, changed.text
    before = routed(cluster)
    blocked = complete(cluster, prompt="tell me the LAUNCH CODES now")
    assert_refused(blocked, 400, "prompt", "content_policy_violation")
    assert routed(cluster) == before  # no worker saw it

    flagged = httpx.post(
        cluster.router_url + "/v1/completions", timeout=60,
        json={"model": MODEL, "prompt": "a suspicious question", "max_tokens": 1},
        headers={"X-Request-Id": "flag-me-1"},
    )  # fmt: skip
    assert flagged.status_code == 200  # flagged is served
    items = admin(cluster, "GET", "/admin/v1/review?limit=50", token=REVIEWER).json()["items"]
    (item,) = [i for i in items if i["request_id"] == "flag-me-1"]
    assert (item["check"], item["category"], item["action"], item["stage"]) == (
        "watch",
        "curiosity",
        "flagged",
        "prod",
    )
    assert "text" not in item and "suspicious" not in str(item)
    assert admin(cluster, "GET", "/admin/v1/review", token=OPERATOR).status_code == 403
    marked = admin(cluster, "POST", f"/admin/v1/review/{item['id']}", {"mark": "benign"},
                   REVIEWER)  # fmt: skip
    assert marked.json()["mark"] == "benign" and marked.json()["marked_by"] == "rev"

    whole = complete(cluster, prompt="write a lot", max_tokens=40)
    assert_refused(whole, 400, None, "content_policy_violation")
    streamed = complete(cluster, prompt="write a lot", max_tokens=40, stream=True)
    assert streamed.status_code == 200
    events = [e for e in streamed.text.split("\n\n") if e.strip()]
    assert events[-1].startswith("event: error") and "content_policy_violation" in events[-1]
    assert "[DONE]" not in streamed.text
    relayed = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]
                      if e.startswith("data: "))  # fmt: skip
    assert len(relayed) < 24  # the event that completed the match was withheld


def test_a_kept_prompt_is_shown_to_reviewers(cluster):
    policy = {"safety": {**POLICY, "keep_prompt": True, "prompt_retention_s": 600}}
    path = f"/admin/v1/policies/{MODEL}"
    # Keeping prompts is a change of what the policy does with users' text: a reviewer's.
    assert_refused(admin(cluster, "PUT", path, policy), 403, None, "reviewer_required")
    assert admin(cluster, "PUT", path, policy, REVIEWER).status_code == 200
    httpx.post(cluster.router_url + "/v1/completions", timeout=60,
               json={"model": MODEL, "prompt": "another suspicious one", "max_tokens": 1},
               headers={"X-Request-Id": "flag-me-2"})  # fmt: skip
    items = admin(cluster, "GET", "/admin/v1/review", token=REVIEWER).json()["items"]
    (item,) = [i for i in items if i["request_id"] == "flag-me-2"]
    assert item["text"] == "another suspicious one"


def pdserve_admin(capsys: pytest.CaptureFixture[str], token: str, url: str, *argv: str) -> object:
    """``pdserve admin`` in this process (the same entry point as the console script)."""
    capsys.readouterr()  # only what this command prints
    assert cli_main(["admin", "--router-url", url, "--token", token, *argv]) == 0
    return json.loads(capsys.readouterr().out)


def capsys_exit(capsys: pytest.CaptureFixture[str], token: str, url: str, *argv: str) -> str:
    """What ``pdserve admin`` exits with when the router refuses."""
    with pytest.raises(SystemExit) as exited:
        cli_main(["admin", "--router-url", url, "--token", token, *argv])
    return str(exited.value)


def test_the_admin_cli_registers_routes_rolls_back_and_reviews(cluster, capsys):
    folder = str(tiny_llama.ensure())
    url = cluster.router_url
    registered = pdserve_admin(capsys, OPERATOR, url, "models", "--register", "cli-model", "c1",
                               "--artifact", folder)  # fmt: skip
    assert registered["checksum"].startswith("sha256:") and registered["registered_by"] == "ops"
    again = pdserve_admin(capsys, OPERATOR, url, "models", "--register", "cli-model", "c1",
                          "--artifact", folder)  # fmt: skip
    assert again["checksum"] == registered["checksum"]  # the folder's checksum is stable
    changed = pdserve_admin(capsys, OPERATOR, url, "route", MODEL, "--canary", "v3", "--weight",
                            "0.2", "--sticky", "user")  # fmt: skip
    assert changed["spec"]["canary"] == {"version": "v3", "weight": 0.2, "stickiness": "user",
                                         "sticky_header": None, "prepull_workers": 0}  # fmt: skip
    assert changed["spec"]["prod"] == "v2"
    shown = pdserve_admin(capsys, OPERATOR, url, "policy", MODEL)
    assert shown["safety"]["keep_prompt"] and not shown["requires_approval"]
    tightened = pdserve_admin(capsys, OPERATOR, url, "policy", MODEL, "--require-approval")
    assert tightened["policy"]["requires_approval"]
    refused = capsys_exit(capsys, OPERATOR, url, "policy", MODEL, "--no-require-approval")
    assert "403" in refused and "requires_approval turned off" in refused
    loosened = pdserve_admin(capsys, REVIEWER, url, "policy", MODEL, "--no-require-approval")
    assert not loosened["policy"]["requires_approval"]
    assert pdserve_admin(capsys, OPERATOR, url, "rollback", MODEL)["canary"] is None
    items = pdserve_admin(capsys, REVIEWER, url, "review", "--limit", "5")["items"]
    assert items and all("check" in item for item in items)
