"""One engine (vLLM or a sim) as a bare process, for measurements that need no router."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from agent import process_group
from agent.engine_spec import EngineSpec


@contextlib.contextmanager
def running_engine(spec: EngineSpec, log_path: Path, ready_timeout_s: float = 600) -> Iterator[str]:
    """Start the engine, yield its base URL once /health answers, stop its process group."""
    url = f"http://{spec.host}:{spec.port}"
    process = process_group.spawn(spec.argv(), env=spec.env(dict(os.environ)), log_path=log_path)
    try:
        process_group.wait_until(
            lambda: process_group.http_ok(url + "/health"), timeout_s=ready_timeout_s,
            what=f"engine (log {log_path})", process=process, interval_s=0.5,
        )  # fmt: skip
        yield url
    finally:
        process_group.stop([process], grace_s=30)
