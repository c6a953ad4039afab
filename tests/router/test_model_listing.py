"""``/v1/models`` lists a model only while a request to it can be answered; a model
whose workers are registered but form no path gets a 503 to retry, never a 500."""

from __future__ import annotations

import pytest

from tests.router.test_api_errors import CHAT, dead_url, error_of, listed, post


def _register(router, worker_id: str, role: str, model: str, **fields) -> None:
    worker = {"worker_id": worker_id, "role": role, "model": model, "engine_url": dead_url(),
              **fields}  # fmt: skip
    assert router.agent("POST", "/admin/workers/register", worker).status_code == 200


def _not_ready(router, worker_id: str) -> None:
    beat = {"worker_id": worker_id, "ready": False}
    assert router.agent("POST", "/admin/workers/heartbeat", beat).status_code == 200


@pytest.mark.parametrize(("present", "missing"), [("prefill", "decode"), ("decode", "prefill")])
@pytest.mark.parametrize("stream", [False, True])
def test_without_serve_degraded_half_a_pool_is_unlisted_and_503_with_retry_after(
    strict_router, tiny_model, present, missing, stream
):
    """The window while one role is up and the other still loads (or probes). The worker
    registers as an agent does, tokenizer and block size included, so the prompt is
    measured before the router finds no path. (By default the pool left serves whole
    requests: tests/sim/test_sim_cluster.py.)"""
    router, model = strict_router, f"half-{present}-{stream}"
    _register(router, f"{present}-{model}", present, model, tokenizer_path=str(tiny_model),
              block_size=128, max_model_len=4096)  # fmt: skip
    assert model not in listed(router)
    for path, body in (("/v1/chat/completions", {**CHAT, "model": model}),
                       ("/v1/completions", {"model": model, "prompt": "hi"})):  # fmt: skip
        response = post(router, path, json={**body, "stream": stream})
        assert response.status_code == 503, response.text
        assert int(response.headers["Retry-After"]) >= 1
        error = error_of(response)
        assert (error["type"], error["code"]) == ("service_unavailable", "no_ready_worker")
        assert missing in error["message"]


def test_a_model_is_listed_while_a_path_is_ready(strict_router):
    router = strict_router
    _register(router, "p-path", "prefill", "pathed")
    assert "pathed" not in listed(router)
    _register(router, "d-path", "decode", "pathed")
    assert "pathed" in listed(router)
    _not_ready(router, "d-path")  # decode drains or reloads: no P/D path left
    assert "pathed" not in listed(router)
    _register(router, "c-path", "colocated", "pathed")
    assert "pathed" in listed(router)
