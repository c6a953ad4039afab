"""A request body as one engine gets it: what differs between engines of the same pool."""

from __future__ import annotations

import json
from typing import Any

from router.fleet.registry import WorkerState
from router.prepare.prepare import PreparedRequest


def engine_json(body: dict[str, Any], request: PreparedRequest, worker: WorkerState) -> bytes:
    """The body as ``worker``'s engine gets it: an engine that schedules by priority is
    told the request's class (lower goes first, so batch lines wait behind interactive
    work there too, and are preempted first); a first-come engine is told nothing."""
    if worker.registration.scheduling_policy == "priority":
        body = {**body, "priority": request.priority}
    return json.dumps(body).encode()
