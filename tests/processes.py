"""Processes and listening ports, read from /proc: what a test run or a cluster leaves behind.

A process is known by its pid *and* its start time, so a pid the kernel reused for
another process is never mistaken for the one a test started.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# Set in the test process's environment: every process it starts inherits it, even one
# that left the suite's process tree and sessions (a daemon, an orphan's orphan).
SUITE_MARKER_ENV = "PYTEST_PDSERVE_SUITE"  # not PDSERVE_*: some tests strip those
_TCP_LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class Process:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str  # "Z": a zombie, dead and waiting to be reaped
    start_ticks: int

    @property
    def key(self) -> tuple[int, int]:
        return self.pid, self.start_ticks

    def command(self) -> str:
        try:
            return (PROC / str(self.pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return "?"


def read_process(pid: int) -> Process | None:
    """The process ``pid`` now, or None if there is none."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # fields[0] is stat's third field, the state
    return Process(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0], int(fields[19]))


def snapshot() -> dict[int, Process]:
    """Every process alive now, by pid."""
    processes = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (process := read_process(int(entry.name))) is not None:
            processes[process.pid] = process
    return processes


def alive(process: Process) -> bool:
    """Is this very process (not a reuse of its pid) still running?"""
    now = read_process(process.pid)
    return now is not None and now.start_ticks == process.start_ticks and now.state != "Z"


def carries_marker(pid: int, marker: str) -> bool:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{SUITE_MARKER_ENV}={marker}".encode() in environ.split(b"\0")


def descendants(root: int, processes: dict[int, Process]) -> set[int]:
    children: dict[int, list[int]] = {}
    for process in processes.values():
        children.setdefault(process.ppid, []).append(process.pid)
    found, frontier = set(), list(children.get(root, []))
    while frontier:
        pid = frontier.pop()
        found.add(pid)
        frontier.extend(children.get(pid, []))
    return found


def started_by(
    me: int, marker: str, before: Iterable[Process], now: dict[int, Process]
) -> list[Process]:
    """The live processes, absent from ``before``, that ``me`` started: its descendants,
    those that carry its marker, and those in a session or process group that one of
    them (or ``me``, when it leads one) created during the run."""
    existed = {process.key for process in before}
    new = {p.pid: p for p in now.values() if p.key not in existed and p.state != "Z"}
    new.pop(me, None)
    tree = descendants(me, now)
    own = {pid for pid in new if pid in tree or carries_marker(pid, marker)}
    leaders = own | {me}
    groups = {g for pid in own for g in (now[pid].pgid, now[pid].sid) if g in leaders}
    groups |= {g for g in (now[me].pgid, now[me].sid) if g == me} if me in now else set()
    return [p for p in new.values() if p.pid in own or p.pgid in groups or p.sid in groups]


def listening_ports(ports: Iterable[int]) -> set[int]:
    """Which of ``ports`` some socket listens on (TCP, IPv4 or IPv6, any address)."""
    wanted, listening = set(ports), set()
    for table in (PROC / "net" / "tcp", PROC / "net" / "tcp6"):
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == _TCP_LISTEN and port in wanted:
                listening.add(port)
    return listening


def describe(processes: Iterable[Process]) -> str:
    return "\n".join(
        f"  pid {p.pid} (parent {p.ppid}, group {p.pgid}, session {p.sid}): {p.command()[:200]}"
        for p in processes
    )
