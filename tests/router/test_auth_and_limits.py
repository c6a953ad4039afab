"""Auth with the admin API off (403 on every admin route), client API keys end to end,
and 429 with Retry-After when the registry is full. Each route's scope: ``test_access``."""

from __future__ import annotations

import httpx
import pytest

from contracts.agent_tokens import agent_token
from router.http.access import Access
from router.http.api import ROUTES
from tests.router.conftest import ADMIN_TOKEN, AGENT_SECRET, running_router

OPEN = (Access.PUBLIC, Access.CLIENT)
ADMIN_ROUTES = [(r.method, r.path) for r in ROUTES if r.access not in OPEN]
WORKER = {"worker_id": "w", "role": "colocated", "model": "m", "engine_url": "http://127.0.0.1:9"}


@pytest.fixture(scope="module")
def keyed_router():
    with running_router(
        PDSERVE_ADMIN_TOKEN=ADMIN_TOKEN,
        PDSERVE_AGENT_SECRET=AGENT_SECRET,
        PDSERVE_API_KEYS="key-a,key-b",
        PDSERVE_MAX_WORKERS="1",
        PDSERVE_HEALTH_INTERVAL_S="3600",
    ) as router:
        yield router  # fmt: skip


@pytest.fixture(scope="module")
def no_admin_router():
    with running_router() as router:
        yield router


def error_type(response: httpx.Response) -> str:
    return response.json()["error"]["type"]


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_every_admin_route_is_403_while_the_admin_api_is_off(no_admin_router, method, path):
    headers = {"Authorization": "Bearer anything"}
    response = httpx.request(method, no_admin_router.url + path, json=WORKER, headers=headers)
    assert response.status_code == 403
    assert "PDSERVE_ADMIN_TOKEN" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")],
)
def test_client_routes_need_one_of_the_api_keys(keyed_router, method, path):
    body = {
        "model": "nothing-served",
        "prompt": "x",
        "messages": [{"role": "user", "content": "x"}],
    }
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ):
        response = httpx.request(method, keyed_router.url + path, json=body, headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["code"] == "invalid_api_key"
    for key in ("key-a", "key-b"):
        response = httpx.request(method, keyed_router.url + path, json=body,
                                 headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        # Past auth: the listing answers, a generation finds no such model.
        assert response.status_code == (200 if method == "GET" else 404)


def test_a_full_registry_answers_429_with_retry_after(keyed_router):
    def agent(worker_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {agent_token(AGENT_SECRET, worker_id)}"}

    url = keyed_router.url + "/admin/workers/register"
    assert httpx.post(url, json=WORKER, headers=agent("w")).status_code == 200
    response = httpx.post(url, json={**WORKER, "worker_id": "w2"}, headers=agent("w2"))
    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) >= 1
    assert error_type(response) in {"rate_limit_error", "overloaded_error", "rate_limit_exceeded"}
