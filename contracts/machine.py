"""The machine a process runs on, as far as engine speed depends on it.

Two readers share it: the agent picks the engine's dtype from the CPU's flags
(``agent.engine_dtype``), and every benchmark result records ``machine_record()`` so
that a number can be told apart from the machine that made it. The parsing is pure
(over ``/proc/cpuinfo``'s text); only ``read_cpu`` and ``machine_record`` do I/O.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The flags that decide how fast a CPU engine computes: AVX2 is vLLM CPU's floor,
# AVX-512 its fast path, and AVX-512 BF16 / AMX the only native bf16 on x86.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
# x86 flags that compute bf16 natively; without one, bf16 is emulated (5x slower measured).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuInfo:
    """One CPU's model name and flags (every core of a machine reports the same)."""

    model: str
    flags: frozenset[str]
    arch: str = "x86_64"

    @property
    def native_bf16(self) -> bool:
        """Whether bf16 matrix maths runs in hardware. Arm's ``bf16`` flag counts too."""
        return bool(self.flags & NATIVE_BF16_FLAGS) or "bf16" in self.flags

    def speed_flags(self) -> dict[str, bool]:
        return {flag: flag in self.flags for flag in SPEED_FLAGS}


def parse_cpuinfo(text: str, arch: str = "x86_64") -> CpuInfo:
    """The first processor's ``model name`` and ``flags`` (x86) or ``Features`` (Arm)."""
    model, flags = "", ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = value
    return CpuInfo(model=model or "unknown", flags=frozenset(flags.split()), arch=arch)


def read_cpu(path: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    """This machine's CPU; an unreadable cpuinfo (not Linux) gives no flags."""
    try:
        text = path.read_text()
    except OSError:
        text = ""
    return parse_cpuinfo(text, arch=platform.machine() or "unknown")


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(_REPO), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def machine_record() -> dict:
    """What every benchmark result records of its machine: CPU model, the flags that
    matter, core count, memory, and the commit the code was at."""
    cpu = read_cpu()
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        memory_gib = None
    return {
        "cpu_model": cpu.model,
        "arch": cpu.arch,
        "cpu_flags": cpu.speed_flags(),
        "native_bf16": cpu.native_bf16,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "commit": _commit(),
    }


def describe(record: dict) -> str:
    """One line of a ``machine_record()``: for reports and plot titles."""
    flags = " ".join(flag for flag, on in (record.get("cpu_flags") or {}).items() if on)
    return (
        f"{record.get('cpu_model', 'unknown CPU')}, {record.get('cores')} cores, "
        f"flags: {flags or 'none of ' + ' '.join(SPEED_FLAGS)}, commit {record.get('commit')}"
    )
