"""Malformed bodies never get a 5xx: generated requests against the router of the shared
sim cluster, over real HTTP. Every refusal is a 4xx in OpenAI's error shape.

Bodies start from a valid request of each endpoint and are then bent: fields replaced by
values of any JSON type (huge, negative, NaN-like, nested), the other endpoint's fields
added, required fields dropped; and raw bytes that are not JSON at all. Generation is
derandomized (a fixed seed), so a failure reproduces; hypothesis prints the body.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.clusters import MODEL

FIELDS = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream",
          "stream_options", "n", "temperature", "top_p", "seed", "stop", "logprobs", "echo",
          "kv_transfer_params", "response_format", "tools", "tool_choice", "min_tokens",
          "return_token_ids", "best_of", "user")  # fmt: skip
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 1e308, -1e308, 1e-300]),
    st.text(max_size=20), st.sampled_from(["", MODEL, "user", "true", "NaN", "1"]),
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
BASE = {
    "/v1/completions": {"model": MODEL, "prompt": "hello", "max_tokens": 2},
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 2,
                             "messages": [{"role": "user", "content": "hello"}]},
}  # fmt: skip


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(BASE)))
    if draw(st.integers(0, 9)) == 0:  # not JSON, or JSON cut short
        raw = json.dumps(BASE[path]).encode()
        return path, draw(st.sampled_from([raw[: len(raw) // 2], b"", b"[", b"nul", raw + b"}",
                                           b'{"model": NaN}', b"\xff\xfe"]))  # fmt: skip
    body = dict(BASE[path])
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        if draw(st.booleans()) and field in body:
            del body[field]
        else:
            body[field] = draw(JSON)
    # A long generation is not what is tested: keep integer output caps small when valid.
    for cap in ("max_tokens", "max_completion_tokens", "n", "min_tokens", "best_of"):
        value = body.get(cap)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            body[cap] = min(value, 4)
    if isinstance(body.get("messages"), list):
        body["messages"] = body["messages"][:4]
    return path, json.dumps(body).encode()


# Bodies per example, sent at once: one at a time, the test waited on the sim's decode
# steps (50 s for 2,000 bodies), not on the router.
BATCH = 25
# The fast tier sends a derandomized first 400; the slow tier (``make test``) all 2,000.
BODIES = [400, pytest.param(2000, marks=pytest.mark.slow)]
SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
}


async def answers(base_url: str, batch: list[tuple[str, bytes]]) -> list[tuple[int, str]]:
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:

        async def send(path: str, payload: bytes) -> tuple[int, str]:
            response = await http.post(path, content=payload, headers=headers)
            return response.status_code, response.text

        return await asyncio.gather(*(send(path, payload) for path, payload in batch))


@pytest.mark.parametrize("budget", BODIES)
def test_no_body_gets_a_5xx_and_every_refusal_is_openais_shape(sim_cluster, budget):
    sent = []

    @settings(max_examples=budget // BATCH, **SETTINGS)
    @given(batch=st.lists(bodies(), min_size=BATCH, max_size=BATCH))
    def fuzz(batch: list[tuple[str, bytes]]) -> None:
        for (path, payload), (status, text) in zip(
            batch, asyncio.run(answers(sim_cluster.router_url, batch)), strict=True
        ):
            sent.append(status)
            assert status < 500, (status, path, payload, text[:500])
            if status >= 400:
                error = json.loads(text)["error"]
                assert set(error) == {"message", "type", "param", "code"}, (path, payload, text)

    fuzz()
    assert len(sent) >= budget
    # Both sides were exercised: refusals, and bodies that were served.
    assert sum(s >= 400 for s in sent) > budget // 10 and sum(s == 200 for s in sent) > budget // 10
