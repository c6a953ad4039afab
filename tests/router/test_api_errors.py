"""Bad input and missing capacity get OpenAI-shaped errors with the right status."""

from __future__ import annotations

import httpx
import pytest

from localrun.ports import free_ports

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def post(router, path: str, **kwargs) -> httpx.Response:
    return httpx.post(router.url + path, timeout=10, **kwargs)


def dead_url() -> str:
    (port,) = free_ports(1)
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "temperature": 5}, "temperature"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": 10**9}, "max_tokens"),
        ({**CHAT, "n": 0}, "n"),
        ({**CHAT, "messages": []}, "messages"),
        ({"messages": CHAT["messages"]}, "model"),
        ({**CHAT, "kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_invalid_fields_are_400_naming_the_field(router, body, param):
    response = post(router, "/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b""])
def test_malformed_json_is_400(router, content):
    response = post(router, "/v1/completions", content=content)
    assert response.status_code == 400
    assert error_of(response)["type"] == "invalid_request_error"


def test_oversized_body_is_413(router):
    huge = {"model": "m", "prompt": "x" * 70_000}
    response = post(router, "/v1/completions", json=huge)
    assert response.status_code == 413
    assert error_of(response)["code"] == "body_too_large"


def test_unknown_model_is_404(router):
    response = post(router, "/v1/chat/completions", json={**CHAT, "model": "nobody-serves-this"})
    assert response.status_code == 404
    error = error_of(response)
    assert (error["param"], error["code"]) == ("model", "model_not_found")


def listed(router) -> set[str]:
    return {m["id"] for m in httpx.get(router.url + "/v1/models", timeout=10).json()["data"]}


def test_a_pool_without_decode_is_503_with_retry_after_without_serve_degraded(strict_router):
    strict_router.register("p-only", "prefill", "half-model", dead_url())
    response = post(strict_router, "/v1/chat/completions", json={**CHAT, "model": "half-model"})
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) >= 1
    assert "decode" in error_of(response)["message"]


def test_a_worker_that_says_not_ready_gets_no_traffic(strict_router):
    router = strict_router  # the prefill alone would serve (502, its engine being dead)
    router.register("p-busy", "prefill", "warming", dead_url())
    router.register("d-busy", "decode", "warming", dead_url())
    beat = {"worker_id": "d-busy", "ready": False}
    assert router.agent("POST", "/admin/workers/heartbeat", beat).status_code == 200
    response = post(router, "/v1/completions", json={"model": "warming", "prompt": "hi"})
    assert response.status_code == 503


def test_dead_prefill_without_a_spare_is_a_clear_502(router):
    router.register("p-dead", "prefill", "doomed", dead_url())
    router.register("d-dead", "decode", "doomed", dead_url())
    response = post(router, "/v1/completions", json={"model": "doomed", "prompt": "hi"})
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "prefill_failed"
    assert "p-dead" in error["message"]
    workers = router.admin("GET", "/admin/workers").json()["workers"]
    assert {w["worker_id"]: w["circuit"] for w in workers}["p-dead"] == "open"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "x"}])
def test_admin_api_requires_the_token(router, headers):
    response = httpx.get(router.url + "/admin/workers", headers=headers, timeout=10)
    assert response.status_code == 401
    assert error_of(response)["type"] == "authentication_error"


def test_deregistering_takes_a_worker_and_its_model_away(router):
    router.register("c-gone", "colocated", "retired", dead_url())
    assert "retired" in listed(router)
    assert router.agent("DELETE", "/admin/workers/c-gone").status_code == 200
    assert "retired" not in listed(router)
    assert router.agent("DELETE", "/admin/workers/c-gone").status_code == 404


def test_a_registration_the_router_cannot_route_is_refused_with_400(router):
    worker = {"worker_id": "p-xx", "role": "prefill", "model": "xx-model",
              "engine_url": dead_url(), "prefix_caching_hash_algo": "xxhash"}  # fmt: skip
    answer = router.agent("POST", "/admin/workers/register", worker)
    assert answer.status_code == 400
    assert "prefix_caching_hash_algo" in answer.json()["error"]["message"]
    workers = router.admin("GET", "/admin/workers").json()["workers"]
    assert "p-xx" not in {w["worker_id"] for w in workers}


def test_a_request_for_the_other_kind_of_model_is_a_clear_400(router):
    router.register("e-kind", "embed", "an-embedder", dead_url())
    router.register("c-kind", "colocated", "a-generator", dead_url())
    chat = post(router, "/v1/chat/completions", json={**CHAT, "model": "an-embedder"})
    embed = post(router, "/v1/embeddings", json={"model": "a-generator", "input": "hi"})
    for response in (chat, embed):
        assert response.status_code == 400
        assert (error_of(response)["param"], error_of(response)["code"]) == (
            "model", "wrong_model_kind",
        )  # fmt: skip
    assert "/v1/embeddings" in error_of(chat)["message"]


def test_more_inputs_than_the_cap_are_413_before_any_worker_is_asked(router):
    router.register("e-cap", "embed", "capped-embedder", dead_url())
    response = post(router, "/v1/embeddings", json={"model": "capped-embedder",
                                                    "input": ["a"] * 2049})  # fmt: skip
    assert response.status_code == 413
    assert error_of(response)["code"] == "too_many_inputs"
    workers = router.admin("GET", "/admin/workers").json()["workers"]
    assert {w["worker_id"]: w["circuit"] for w in workers}["e-cap"] == "closed"


def test_dead_embedding_workers_are_each_tried_then_a_clear_502(router):
    router.register("e-dead-0", "embed", "doomed-embedder", dead_url())
    router.register("e-dead-1", "embed", "doomed-embedder", dead_url())
    response = post(router, "/v1/embeddings", json={"model": "doomed-embedder", "input": "hi"})
    assert response.status_code == 502
    error = error_of(response)
    assert error["code"] == "embedding_failed"
    assert "e-dead-0" in error["message"] and "e-dead-1" in error["message"]
