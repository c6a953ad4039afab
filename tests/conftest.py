"""Shared fixtures and tiers.

Tests under tests/real/, and any test parametrised with ``engine="vllm"``, need
real vLLM and carry the ``vllm`` marker. The real tier runs last, and tests marked
``own_engines`` (they start engines of their own) run before the shared real
cluster starts: next to its three engines a fourth takes minutes to load on 2 cores.

The run fails if any process the tests started is still alive at its end
(``no_process_left_behind``).

Under pytest-xdist (``make test``, ``make test-fast``: ``--dist loadfile``) a test
module runs on one worker, so its module-scoped cluster starts once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import processes
from tests.conditions import wait_for

pytest_plugins = ["tests.clusters"]

REAL_TIER = Path(__file__).parent / "real"
# How long what the tests stopped gets to exit before it counts as left behind: the
# cluster fixtures have stopped theirs by then, so this covers exits already under way.
LEFTOVER_GRACE_S = 15.0


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Fail the run if a process the tests started outlives them: a descendant of this
    pytest process, one carrying its marker in its environment, or one in a session or
    group those created. Torn down after every other session fixture. Under
    pytest-xdist each worker runs this for the processes it started itself."""
    me = os.getpid()
    marker = f"{me}-{secrets.token_hex(4)}"
    os.environ[processes.SUITE_MARKER_ENV] = marker
    before = list(processes.snapshot().values())
    yield
    left: list[processes.Process] = []

    def none_left() -> bool:
        left[:] = processes.started_by(me, marker, before, processes.snapshot())
        return not left

    with contextlib.suppress(AssertionError):
        wait_for(none_left, LEFTOVER_GRACE_S, "the processes the tests started to exit")
        return
    described = processes.describe(left)
    for process in left:  # nothing outlives the run, even when it fails
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)
    pytest.fail(
        f"{len(left)} process(es) the tests started were alive {LEFTOVER_GRACE_S:.0f}s after "
        f"the last test (now killed):\n{described}",
        pytrace=False,
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_TIER in Path(item.fspath).parents:
            item.add_marker(pytest.mark.vllm)

    def tier(item: pytest.Item) -> int:
        if item.get_closest_marker("vllm") is None:
            return 0
        return 1 if item.get_closest_marker("own_engines") else 2

    items.sort(key=tier)  # stable: file order holds within a tier
