"""Start-up fixes for an engine process, applied by the agent through ``PYTHONPATH``.

Python imports ``sitecustomize`` in every interpreter it starts, so these reach the
vLLM API server and every process it forks or spawns (engine core, workers). Each
fix is switched on by one environment variable the agent sets, does nothing
without it, and leaves the engine's own code untouched. Measurements behind each:
docs/pd-on-cpu.md.

- ``PDSERVE_ENGINE_CPUS`` ("0", "0-3,8"): pin the process before it starts any
  thread, so every thread and child it makes inherits the agent's cores.
- ``PDSERVE_KEEP_MODEL_THREAD_CORES=1``: vLLM 0.32's NixlConnector, on CPU, calls
  ``os.sched_setaffinity(0, [last core of each NUMA node])`` "to reserve a core
  for KV transfer", but from the thread that runs the model, so it moves the
  model's compute, not the transfer, onto that core (on a 2-core box, every P/D
  engine onto core 1). The fix makes the topology it reserves from empty, which
  is vLLM's own "nothing to reserve" path.
- ``PDSERVE_ENGINE_IDLE_SPIN_S``: vLLM's workers busy-loop (``sched_yield``) on
  their shared-memory queue for 1 s after every message before they sleep on a
  socket (``SpinCondition.busy_loop_s``, not configurable). With each engine on its
  own few cores that spin takes the cores its own engine core and API server need,
  and one engine's spin slowed the next engine's request on a shared core 2x.
  A short spin still covers the gap between decode steps. Past it, vLLM sleeps on a
  socket whose wake-up can be lost (a PUB with a high-water mark of 1), and then
  rechecks only every 5 s: with a short spin that 5 s stall became common, so the
  recheck interval comes down to ``RECHECK_MS`` too.
- ``PDSERVE_KV_EVENTS_BIND=1``: vLLM binds its KV-events PUB socket only for a
  wildcard endpoint (``tcp://*:PORT``, every interface) and connects to a named
  host. The events carry prompt token ids, so the agent names its own host (loopback
  by default) and has vLLM bind exactly that; the router connects.
- ``PDSERVE_NIXL_PROGRESS_DELAY_US``: NIXL's Python agent hard-codes its progress
  thread's poll timeout (``pthrDelay``) to 0, so that thread busy-polls a whole
  core forever. A timeout makes it wait on UCX's event descriptor instead.

No imports from pdserve: this file runs inside the engine's interpreter.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable

Patch = Callable[[types.ModuleType], None]
# How often a sleeping vLLM worker rechecks its queue when a wake-up was lost (vLLM: 5000).
RECHECK_MS = 50


def _parse_cpus(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _keep_model_thread_cores(module: types.ModuleType) -> None:
    platform = getattr(module, "CpuPlatform", None)
    if platform is not None and hasattr(platform, "discover_numa_topology"):
        platform.discover_numa_topology = classmethod(lambda cls: [])


def _idle_spin(seconds: float) -> Patch:
    def patch(module: types.ModuleType) -> None:
        condition = getattr(module, "SpinCondition", None)
        if condition is None:
            return
        real_init = condition.__init__

        def init_with_spin(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            kwargs["busy_loop_s"] = seconds
            real_init(self, *args, **kwargs)

        condition.__init__ = init_with_spin
        module.SHM_READER_RECHECK_INTERVAL_MS = RECHECK_MS

    return patch


def _bind_kv_events(module: types.ModuleType) -> None:
    publisher = getattr(module, "ZmqEventPublisher", None)
    if publisher is not None and hasattr(publisher, "_is_bind_endpoint"):
        publisher._is_bind_endpoint = staticmethod(lambda endpoint: True)


def _nixl_progress_delay(delay_us: int) -> Patch:
    def patch(module: types.ModuleType) -> None:
        bindings = getattr(module, "nixlBind", None)
        if bindings is None or not hasattr(bindings, "nixlAgent"):
            return
        real_agent = bindings.nixlAgent

        def agent_with_delay(name: str, config: object) -> object:
            config.pthrDelay = delay_us  # type: ignore[attr-defined]
            return real_agent(name, config)

        proxy = types.ModuleType(bindings.__name__)
        proxy.__dict__.update(bindings.__dict__)
        proxy.nixlAgent = agent_with_delay  # type: ignore[attr-defined]
        module.nixlBind = proxy  # type: ignore[attr-defined]

    return patch


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch on a module right after it is first imported."""

    def __init__(self, patches: dict[str, Patch]) -> None:
        self._patches = patches

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        patch = self._patches.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_then_patch(module: types.ModuleType) -> None:
            real_exec(module)
            patch(module)

        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def _install(environ: os._Environ[str] | dict[str, str]) -> None:
    cpus = environ.get("PDSERVE_ENGINE_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, _parse_cpus(cpus))
    patches: dict[str, Patch] = {}
    if environ.get("PDSERVE_KEEP_MODEL_THREAD_CORES") == "1":
        patches["vllm.platforms.cpu"] = _keep_model_thread_cores
    if environ.get("PDSERVE_KV_EVENTS_BIND") == "1":
        patches["vllm.distributed.kv_events"] = _bind_kv_events
    spin = environ.get("PDSERVE_ENGINE_IDLE_SPIN_S")
    if spin:
        patches["vllm.distributed.device_communicators.shm_broadcast"] = _idle_spin(float(spin))
    delay = environ.get("PDSERVE_NIXL_PROGRESS_DELAY_US")
    if delay:
        # nixl's package injects its CUDA-flavoured build as ``nixl._api``.
        for api in ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api"):
            patches[api] = _nixl_progress_delay(int(delay))
    if patches:
        sys.meta_path.insert(0, _PatchAfterImport(patches))


_install(os.environ)
