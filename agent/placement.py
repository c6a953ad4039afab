"""Where an engine's threads really run, read from /proc, against where the agent put them.

An engine whose compute lands on another engine's cores is slow in a way no
metric names (see docs/pd-on-cpu.md: vLLM's NIXL connector once moved every P/D
engine's model thread onto core 1 of a 2-core box). So after an engine is ready,
the agent reads every thread of its process tree and refuses to register it while
any thread is outside the agent's assignment.

Invariants checked:
- CPU: every thread of every engine process may run only on the assigned cores;
  a vLLM worker's main thread, which runs the model and is OpenMP's first thread,
  is pinned to the first assigned core, where vLLM's OpenMP binding put it.
- CUDA: every engine process sees exactly the assigned ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# vLLM names its model-running processes like this (setproctitle).
VLLM_WORKER_TITLE = "VLLM::Worker"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpectedPlacement:
    cpus: frozenset[int] | None = None
    # The core the model's main thread must be pinned to (vLLM on CPU); None: not checked.
    model_thread_cpu: int | None = None
    cuda_visible_devices: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadPlacement:
    pid: int
    tid: int
    process_title: str
    thread_name: str
    cpus: frozenset[int]

    @property
    def is_main_thread(self) -> bool:
        return self.pid == self.tid


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0-2,5"`` -> {0, 1, 2, 5} (the kernel's and taskset's list format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def process_tree(root_pid: int, proc: Path = PROC) -> list[int]:
    """``root_pid`` and all its descendants that are alive now."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    tree, frontier = [], [root_pid]
    while frontier:
        pid = frontier.pop()
        tree.append(pid)
        frontier.extend(children.get(pid, []))
    return tree


def read_threads(pids: list[int], proc: Path = PROC) -> list[ThreadPlacement]:
    threads = []
    for pid in pids:
        try:
            title = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode()
            tids = [int(t.name) for t in (proc / str(pid) / "task").iterdir()]
        except OSError:
            continue  # exited meanwhile
        for tid in tids:
            task = proc / str(pid) / "task" / str(tid)
            try:
                name = (task / "comm").read_text().strip()
                status = (task / "status").read_text()
            except OSError:
                continue
            allowed = next(
                line.split(":", 1)[1] for line in status.splitlines()
                if line.startswith("Cpus_allowed_list:")
            )  # fmt: skip
            threads.append(ThreadPlacement(
                pid=pid, tid=tid, process_title=title, thread_name=name,
                cpus=parse_cpu_list(allowed),
            ))  # fmt: skip
    return threads


def cpu_violations(threads: list[ThreadPlacement], expected: ExpectedPlacement) -> list[str]:
    """Each thread that runs where the agent did not put it, in words."""
    problems = []
    if expected.cpus is not None:
        for t in threads:
            if not t.cpus <= expected.cpus:
                problems.append(
                    f"thread {t.tid} ({t.thread_name}) of pid {t.pid} ({t.process_title}) "
                    f"may run on cores {_fmt(t.cpus)}, outside the assigned {_fmt(expected.cpus)}"
                )
    if expected.model_thread_cpu is not None:
        workers = [t for t in threads if t.is_main_thread and VLLM_WORKER_TITLE in t.process_title]
        if not workers:
            problems.append(f"no {VLLM_WORKER_TITLE} process found: cannot check the model thread")
        for t in workers:
            if t.cpus != {expected.model_thread_cpu}:
                problems.append(
                    f"model thread of pid {t.pid} ({t.process_title}) is on cores "
                    f"{_fmt(t.cpus)}, not its OpenMP core {expected.model_thread_cpu}"
                )
    return problems


def cuda_violations(pids: list[int], expected: str, proc: Path = PROC) -> list[str]:
    problems = []
    for pid in pids:
        try:
            environ = (proc / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        seen = next(
            (e[21:].decode() for e in environ if e.startswith(b"CUDA_VISIBLE_DEVICES=")), None
        )
        if seen != expected:
            problems.append(f"pid {pid} sees CUDA_VISIBLE_DEVICES={seen}, not {expected}")
    return problems


def placement_violations(root_pid: int, expected: ExpectedPlacement) -> list[str]:
    """Everything wrong with where the engine rooted at ``root_pid`` runs; [] when all is right."""
    pids = process_tree(root_pid)
    problems = cpu_violations(read_threads(pids), expected)
    if expected.cuda_visible_devices is not None:
        problems += cuda_violations(pids, expected.cuda_visible_devices)
    return problems


def _fmt(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus)) or "none"
