"""Access, swept over the route table itself: a route added tomorrow is covered too.

For every route: anonymous is 401, each scope the route's access does not grant is 403
(401 for a credential of the other kind: an API key on an admin route, an admin or agent
token on a client route), and a token with
the scope gets past access (neither 401 nor 403). Then what each scope may do that the
table cannot say: an agent acts for its own worker only and within the allowed
networks, and /openapi.json shows the admin API to viewers only.
"""

from __future__ import annotations

import re

import httpx
import pytest

from contracts.agent_tokens import agent_token
from router.http.access import Access
from router.http.api import ROUTES
from router.settings import SCOPE_GRANTS
from tests.router.conftest import running_router

SECRET = "sweep-agent-secret"
PEOPLE = {"viewer": "tok-viewer", "planner": "tok-planner", "operator": "tok-operator",
          "reviewer": "tok-reviewer", "admin": "tok-admin"}  # fmt: skip
WORKER = "x"  # every path parameter, so the agent's token is for the worker named
TOKENS = {**PEOPLE, "agent": agent_token(SECRET, WORKER), "client": "key-a"}
# Public by design; anything else marked public by mistake fails here.
PUBLIC = {("GET", "/health"), ("GET", "/metrics"), ("GET", "/openapi.json")}


@pytest.fixture(scope="module")
def router():
    with running_router(
        PDSERVE_ADMIN_TOKENS=",".join(f"{s}-person:{s}:{t}" for s, t in PEOPLE.items()),
        PDSERVE_AGENT_SECRET=SECRET,
        PDSERVE_API_KEYS="key-a",
        PDSERVE_HEALTH_INTERVAL_S="3600",
    ) as process:
        yield process


def call(router, route, token: str | None) -> httpx.Response:
    path = re.sub(r"\{[^}]+\}", WORKER, route.path)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {} if route.method in ("POST", "PUT") else None
    return httpx.request(route.method, router.url + path, json=body, headers=headers, timeout=10)


def granted(scope: str, access: Access) -> bool:
    if access is Access.CLIENT:
        return scope == "client"
    return scope != "client" and access.value in SCOPE_GRANTS[scope]


def test_only_the_known_routes_are_public():
    assert {(r.method, r.path) for r in ROUTES if r.access is Access.PUBLIC} == PUBLIC


@pytest.mark.parametrize("route", [r for r in ROUTES if r.access is not Access.PUBLIC],
                         ids=lambda r: f"{r.method} {r.path}")  # fmt: skip
def test_each_route_answers_each_scope_as_its_access_says(router, route):
    anonymous = call(router, route, None)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["error"]["type"] == "authentication_error"
    for scope, token in TOKENS.items():
        answer = call(router, route, token)
        if granted(scope, route.access):
            assert answer.status_code not in (401, 403), (scope, answer.text)
        else:
            # A credential of the other kind is no credential here: 401, not 403.
            other_kind = (route.access is Access.CLIENT) != (scope == "client")
            expected = 401 if other_kind else 403
            assert answer.status_code == expected, (scope, answer.text)
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


def worker(worker_id: str, engine_url: str = "http://127.0.0.1:9", **extra: object) -> dict:
    return {"worker_id": worker_id, "role": "colocated", "model": "m-agent",
            "engine_url": engine_url, **extra}  # fmt: skip


def as_agent(router, method: str, path: str, body: dict | None, worker_id: str):
    headers = {"Authorization": f"Bearer {agent_token(SECRET, worker_id)}"}
    return httpx.request(method, router.url + path, json=body, headers=headers, timeout=10)


def test_an_agent_acts_for_its_own_worker_only(router):
    assert (
        as_agent(router, "POST", "/admin/workers/register", worker("w1"), "w1").status_code == 200
    )
    # Another host's token cannot take over w1, beat for it, or deregister it.
    for method, path, body in (
        ("POST", "/admin/workers/register", worker("w1", "http://127.0.0.2:9")),
        ("POST", "/admin/workers/heartbeat", {"worker_id": "w1", "ready": False}),
        ("DELETE", "/admin/workers/w1", None),
    ):
        answer = as_agent(router, method, path, body, "w2")
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "not_this_agents_worker"
    workers = httpx.get(
        router.url + "/admin/workers", headers={"Authorization": "Bearer tok-viewer"}
    )
    (w1,) = [w for w in workers.json()["workers"] if w["worker_id"] == "w1"]
    assert (w1["engine_url"], w1["ready"]) == ("http://127.0.0.1:9", True)
    # An agent token minted with another secret is nobody's.
    forged = {"Authorization": f"Bearer {agent_token('guess', 'w1')}"}
    answer = httpx.delete(router.url + "/admin/workers/w1", headers=forged)
    assert answer.status_code == 401


@pytest.mark.parametrize("field", ["engine_url", "kv_events_endpoint"])
@pytest.mark.parametrize("host", ["10.1.2.3", "192.0.2.7", "[2001:db8::1]"])
def test_a_worker_outside_the_allowed_networks_is_refused(router, field, host):
    url = f"http://{host}:8000" if field == "engine_url" else f"tcp://{host}:5557"
    answer = as_agent(router, "POST", "/admin/workers/register", worker("w-far", **{field: url}),
                      "w-far")  # fmt: skip
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "worker_outside_allowed_networks" and field in error["message"]


def test_a_worker_on_a_name_that_resolves_to_loopback_is_accepted(router):
    registered = as_agent(router, "POST", "/admin/workers/register",
                          worker("w-name", "http://localhost:9"), "w-name")  # fmt: skip
    assert registered.status_code == 200, registered.text


def test_the_schema_shows_the_admin_api_to_viewers_only(router):
    anonymous = httpx.get(router.url + "/openapi.json").json()
    assert "/v1/chat/completions" in anonymous["paths"]
    assert not [path for path in anonymous["paths"] if path.startswith("/admin")]
    assert "WorkerRegistration" not in anonymous["components"]["schemas"]
    assert "ChatMessage" in anonymous["components"]["schemas"]
    for token in ("key-a", TOKENS["agent"]):
        shown = httpx.get(
            router.url + "/openapi.json", headers={"Authorization": f"Bearer {token}"}
        )
        assert shown.json()["paths"].keys() == anonymous["paths"].keys()
    viewer = httpx.get(router.url + "/openapi.json", headers={"Authorization": "Bearer tok-viewer"})
    assert "/admin/v1/policies/{model_id}" in viewer.json()["paths"]
