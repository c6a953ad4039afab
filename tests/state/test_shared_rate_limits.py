"""Two router replicas sharing Redis take from one bucket per tenant: a tenant's quota is
the cluster's, not each replica's."""

from __future__ import annotations

import json

import httpx

from localrun.redis_server import running_redis
from tests.router.conftest import ADMIN_TOKEN, AGENT_SECRET, running_router

TENANTS = {"team": {"keys": ["key-team"], "rpm": 3}}
HEADERS = {"Authorization": "Bearer key-team"}


def test_a_tenants_requests_per_minute_hold_across_two_replicas(tmp_path):
    settings = {
        "PDSERVE_ADMIN_TOKEN": ADMIN_TOKEN,
        "PDSERVE_AGENT_SECRET": AGENT_SECRET,
        "PDSERVE_TENANTS": json.dumps(TENANTS),
        "PDSERVE_HEALTH_INTERVAL_S": "3600",
    }
    with (
        running_redis(tmp_path) as url,
        running_router(**settings, PDSERVE_STATE_URL=url) as one,
        running_router(**settings, PDSERVE_STATE_URL=url) as two,
    ):
        for replica in (one, two):
            # Admission runs before any engine is called: nothing listens on port 9.
            replica.register("w", "colocated", "m", "http://127.0.0.1:9")
        statuses = []
        for replica in (one, two, one, two):
            answer = httpx.post(replica.url + "/v1/completions", headers=HEADERS, timeout=10,
                                json={"model": "m", "prompt": "x", "max_tokens": 1})  # fmt: skip
            statuses.append(answer.status_code)
        # Three admitted (then 502: the engine is unreachable, or 503 once the router has
        # marked it down), the fourth refused by the bucket the replicas share.
        assert all(status in (502, 503) for status in statuses[:3]), statuses
        assert statuses[3] == 429
        assert answer.json()["error"]["code"] == "rate_limit_rpm"
        assert int(answer.headers["retry-after"]) >= 1
