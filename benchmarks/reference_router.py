"""The router of another checkout (say, the tree before a change) in front of a running
local cluster's engines: ``benchmarks.router_cpu`` measures its CPU beside the current
router's, ``benchmarks.router_diff`` compares its answers with the current router's.

The other tree's router runs with this interpreter, ``python -m cli.main router`` from
the tree's folder: the folder is first on ``sys.path``, so the tree's own packages win
over the editable install of this checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from agent import process_group
from contracts.agent_tokens import agent_token
from contracts.workers import WorkerRegistration
from localrun.cluster import LocalCluster
from localrun.ports import free_ports

NEVER = "1000000"  # seconds: the registration made here is never refreshed
# What the reference router runs with beyond its cluster's router settings: no agent
# heartbeats it, so its workers must never go stale or be forgotten.
NEVER_STALE = {"PDSERVE_HEARTBEAT_TIMEOUT_S": NEVER, "PDSERVE_FORGET_AFTER_S": NEVER}


def start_reference_router(
    tree: Path, cluster: LocalCluster, run_dir: Path, router_env: dict[str, str]
) -> tuple[str, subprocess.Popen]:
    """Start ``tree``'s router with ``router_env`` (PDSERVE_* settings) and register every
    worker of ``cluster`` with it once, ready; its log is ``run_dir/router_ref.log``."""
    (port,) = free_ports(1)
    env = {**os.environ, **router_env, **cluster.router_secrets(), **NEVER_STALE}
    with (run_dir / "router_ref.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "router", "--port", str(port)], cwd=tree,
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    process_group.wait_until(lambda: process_group.http_ok(url + "/health"), timeout_s=60,
                             what="reference router", process=process)  # fmt: skip
    known = set(WorkerRegistration.model_fields)
    for worker in cluster.admin("GET", "/admin/workers")["workers"]:
        registration = {k: v for k, v in worker.items() if k in known}
        beat = {"worker_id": worker["worker_id"], "ready": True,
                "incarnation": worker["incarnation"]}  # fmt: skip
        # The worker's agent token; a tree from before agent tokens took the admin token.
        tokens = (agent_token(cluster.agent_secret, worker["worker_id"]), cluster.admin_token)
        for path, body in (("/admin/workers/register", registration),
                           ("/admin/workers/heartbeat", beat)):  # fmt: skip
            _post_with_either(url + path, body, tokens)
    return url, process


def _post_with_either(url: str, body: dict, tokens: tuple[str, str]) -> None:
    for token in tokens:
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10):
                return
        except urllib.error.HTTPError as error:
            if error.code not in (401, 403) or token == tokens[-1]:
                raise
