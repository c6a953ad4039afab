"""Faults on sim clusters: a sim's fault settings, and which worker to hit."""

from __future__ import annotations

import httpx

from loadgen.prometheus_text import scrape, total
from localrun.cluster import LocalCluster


def set_faults(cluster: LocalCluster, worker: str, **faults: object) -> httpx.Response:
    return httpx.post(
        cluster.worker(worker).engine_url + "/sim/faults",
        json=faults,
        headers={"Authorization": f"Bearer {cluster.engine_token}"},
    )


def serving_decode(cluster: LocalCluster) -> str:
    """The one decode worker with a running request (the test's own stream), of those
    whose agent still runs."""
    busy = serving_decodes(cluster)
    assert len(busy) == 1, busy
    return busy[0]


def serving_decodes(cluster: LocalCluster) -> list[str]:
    """The decode workers with a running request, of those whose agent still runs."""
    decodes = [w for w in cluster.workers
               if w.role == "decode" and cluster.agents[w.name].poll() is None]  # fmt: skip
    running = "vllm:num_requests_running"
    return [w.name for w in decodes if total(scrape(w.engine_url + "/metrics"), running) > 0]
