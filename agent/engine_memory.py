"""The memory an engine holds, measured from outside it: host RSS of its process tree,
and on NVIDIA GPUs the device memory its processes use (NVML, via nvidia-ml-py).

vLLM's /metrics says how full its KV cache is, not how much memory the engine takes:
the weights, the CUDA graphs and the allocator's slack are only visible from here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from dataclasses import dataclass
from typing import Any

import psutil

log = logging.getLogger("pdserve.agent")


@dataclass(frozen=True, slots=True)
class EngineMemory:
    engine_memory_bytes: float = 0.0
    accelerator_memory_used_bytes: float = 0.0
    accelerator_memory_total_bytes: float = 0.0

    def as_load_fields(self) -> dict[str, float]:
        return {
            "engine_memory_bytes": self.engine_memory_bytes,
            "accelerator_memory_used_bytes": self.accelerator_memory_used_bytes,
            "accelerator_memory_total_bytes": self.accelerator_memory_total_bytes,
        }


def measure(engine_pid: int | None) -> EngineMemory:
    if engine_pid is None:
        return EngineMemory()
    try:
        root = psutil.Process(engine_pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return EngineMemory()
    rss = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            rss += process.memory_info().rss
    used, total = _accelerator_memory({p.pid for p in processes})
    return EngineMemory(rss, used, total)


def accelerator_name() -> str:
    """The first NVIDIA device's name as a cost-model key, or "cpu"."""
    nvml = _nvml()
    if nvml is None:
        return "cpu"
    try:
        name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))
    except Exception:  # NVML raises its own error tree; any means "no name"
        return "cpu"
    if isinstance(name, bytes):
        name = name.decode()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "cpu"


def _accelerator_memory(pids: set[int]) -> tuple[float, float]:
    nvml = _nvml()
    if nvml is None:
        return 0.0, 0.0
    used = total = 0.0
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            device = nvml.nvmlDeviceGetHandleByIndex(index)
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(device)
            ours = [p.usedGpuMemory or 0 for p in processes if p.pid in pids]
            if ours:
                used += sum(ours)
                total += nvml.nvmlDeviceGetMemoryInfo(device).total
    except Exception as error:  # see accelerator_name
        log.debug("NVML read failed: %s", error)
    return used, total


@functools.cache
def _nvml() -> Any | None:
    """The initialised NVML module, or None on a machine without an NVIDIA driver."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # ImportError, or NVMLError when no driver is loaded
        return None
    return pynvml
