"""What the suite's leftover check (tests/conftest.py) counts as started by the tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests import processes
from tests.conditions import wait_for


@pytest.fixture
def before() -> list[processes.Process]:
    return list(processes.snapshot().values())


@pytest.fixture
def started() -> Iterator[list[tuple[subprocess.Popen, int]]]:
    """What this test starts: each ``sh`` and the pid it printed, all killed at the end."""
    spawned: list[tuple[subprocess.Popen, int]] = []
    yield spawned
    for popen, pid in spawned:
        for victim in (pid, popen.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        popen.wait()


def _spawn(started: list[tuple[subprocess.Popen, int]], script: str, env: dict[str, str]) -> int:
    """``sh -c script`` in a session of its own; returns the pid it prints."""
    popen = subprocess.Popen(
        ["sh", "-c", script], env=env, stdout=subprocess.PIPE, start_new_session=True
    )
    pid = int(popen.stdout.readline())
    started.append((popen, pid))
    return pid


def _marker() -> str:
    """The run's own (set by its session fixture): what these tests start is under the
    run's leftover check too."""
    return os.environ[processes.SUITE_MARKER_ENV]


def _found(before: list[processes.Process]) -> set[int]:
    now = processes.snapshot()
    return {p.pid for p in processes.started_by(os.getpid(), _marker(), before, now)}


def _orphaned(pid: int) -> bool:
    """Alive, and no longer a descendant of this process (its parent exited)."""
    now = processes.snapshot()
    return pid in now and pid not in processes.descendants(os.getpid(), now)


def _marked() -> dict[str, str]:
    return {"PATH": os.environ["PATH"], processes.SUITE_MARKER_ENV: _marker()}


def test_an_orphan_in_a_session_of_its_own_is_found_by_its_marker(before, started):
    # The daemon's parent exits: it is nobody's descendant and leads its own session.
    orphan = _spawn(started, "setsid sleep 60 & echo $!; exit 0", _marked())
    wait_for(lambda: _orphaned(orphan), 5, "the parent to exit")
    assert orphan in _found(before)


def test_an_unmarked_process_in_a_session_the_tests_made_is_found(before, started):
    # The session leader is ours; its grandchild lost its environment and its parent.
    script = "(env -i sleep 60 & echo $!); exec sleep 60"
    orphan = _spawn(started, script, _marked())
    wait_for(lambda: _orphaned(orphan), 5, "the parent to exit")
    assert orphan in _found(before)


def test_a_process_that_existed_before_is_not_counted(started):
    older = _spawn(started, "echo $$; exec sleep 60", _marked())
    assert older not in _found(list(processes.snapshot().values()))


def test_an_unrelated_process_is_not_counted(before, started):
    # Unmarked, in a session its parent (gone) made: nothing ties it to the tests.
    stranger = _spawn(started, "setsid sleep 60 & echo $!; exit 0", {"PATH": os.environ["PATH"]})
    wait_for(lambda: _orphaned(stranger), 5, "the parent to exit")
    assert stranger not in _found(before)
