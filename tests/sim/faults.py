"""Setting a sim's faults over its admin endpoint."""

from __future__ import annotations

import httpx

from localrun.cluster import LocalCluster


def set_faults(cluster: LocalCluster, worker: str, **faults: object) -> httpx.Response:
    return httpx.post(
        cluster.worker(worker).engine_url + "/sim/faults",
        json=faults,
        headers={"Authorization": f"Bearer {cluster.engine_token}"},
    )
