"""A cold pod's start, from "pod start" to ready, in its parts, with the weights in the
node's cache and without.

What a Kubernetes worker pod does (deploy/k8s), done here as processes: ``pdserve model
pull`` (the init container) copies a version from a local artifact store into a cache
and verifies its checksum, then an agent starts vLLM on the cached folder and registers
with a router. The clock starts before the pull and stops when the agent's ready file
appears (the pod's readiness probe). The parts: the pull (the command's wall time; its
copy and verify seconds), and what the agent reports (``pdserve_worker_start_seconds``):
the engine process's start, vLLM's weight load and warm-up, the agent's prefill probe.
The remainder ("agent and registration") is the agent's own start and its registration.

Uncached: an empty cache, so the pull copies. Cached: the version is already there, so
the pull only verifies it. The two alternate round by round, so that noise from other
work on the box hits both alike. The store is a local folder: the copy reads it from
disk or the page cache, not from a network store, so a real fleet's download time is
not measured here. For that, scale the copy by your store's bandwidth.

    python -m benchmarks.cold_start [--models tiny,smollm2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from agent import process_group
from contracts.agent_tokens import agent_token
from contracts.machine import describe, machine_record
from localrun.cluster import write_private
from localrun.ports import free_ports
from modelstore.checksum import folder_checksum
from modelstore.known import resolve

PARTS = ("pull", "process_start", "weights_load", "engine_warm_up", "probe", "agent_other")
ADMIN, SECRET = "cold-start-admin", "cold-start-secret"
# Where vLLM's process start goes, from its log's timestamps (whole seconds): the API
# server's first line, the engine core process's first, the worker's model init, the
# server listening. Each is a Python process importing torch and vLLM in turn.
MILESTONES = {
    "api_server_first_line": r"\(APIServer pid=\d+\)",
    "engine_core_started": r"Initializing a V1 LLM engine",
    "worker_initializing_model": r"Initializing model took",
    "server_listening": r"Starting vLLM server on",
}
_STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


def start_router(run: Path) -> tuple[subprocess.Popen, str]:
    (port,) = free_ports(1)
    env = {**os.environ, "PDSERVE_ADMIN_TOKEN": ADMIN, "PDSERVE_AGENT_SECRET": SECRET}
    router = process_group.spawn([sys.executable, "-m", "cli.main", "router", "--port",
                                  str(port)], env=env, log_path=run / "router.log")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    process_group.wait_until(lambda: process_group.http_ok(url + "/health", timeout_s=1),
                             timeout_s=60, what="the router", process=router)  # fmt: skip
    return router, url


def pull(model: str, store: Path, checksum: str, cache: Path) -> tuple[float, dict]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "model", "pull", model, "--version", "v1",
         "--store", str(store), "--checksum", checksum, "--cache", str(cache)],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    return time.monotonic() - started, json.loads(done.stdout.strip().splitlines()[-1])


def start_agent(run: Path, name: str, folder: Path, served: str, router_url: str) -> dict:
    """An agent on the pulled folder until its ready file appears; what it reported."""
    (port,) = free_ports(1)
    token = run / f"{name}.token"
    write_private(token, agent_token(SECRET, name))
    ready = run / f"{name}.ready"
    argv = [sys.executable, "-m", "cli.main", "colocated", "--model", str(folder),
            "--served-model-name", served, "--port", str(port), "--router-url", router_url,
            "--ready-file", str(ready), "--log-file", str(run / f"{name}.engine.log")]  # fmt: skip
    env = {**os.environ, "PDSERVE_AGENT_TOKEN_FILE": str(token)}
    agent = process_group.spawn(argv, env=env, log_path=run / f"{name}.log")
    try:
        process_group.wait_until(ready.exists, timeout_s=900, what=f"{name} ready",
                                 process=agent, interval_s=0.05)  # fmt: skip
        ready_at = time.monotonic()
        request = urllib.request.Request(router_url + "/admin/workers",
                                         headers={"Authorization": f"Bearer {ADMIN}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            workers = json.load(response)["workers"]
        phases = next(w["start_phases"] for w in workers if w["worker_id"] == name)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=120)
    return {"ready_at": ready_at, "phases": phases,
            "timeline": engine_timeline(run / f"{name}.engine.log")}  # fmt: skip


def engine_timeline(log: Path) -> dict[str, int]:
    """Seconds from vLLM's first log line to each milestone (whole seconds)."""
    seen: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        stamp = _STAMP.search(line)
        if stamp is None:
            continue
        at = time.mktime(time.strptime("2000-" + stamp[1], "%Y-%m-%d %H:%M:%S"))
        for name, pattern in MILESTONES.items():
            if name not in seen and re.search(pattern, line):
                seen[name] = at
    first = seen.get("api_server_first_line")
    return {k: round(v - first) for k, v in seen.items()} if first else {}


def one_start(run: Path, name: str, model: dict, cache: Path, router_url: str) -> dict:
    started = time.monotonic()
    pull_s, pulled = pull(model["served"], model["store"], model["checksum"], cache)
    agent = start_agent(run, name, Path(pulled["path"]), model["served"], router_url)
    total_s = agent["ready_at"] - started
    phases = agent["phases"]
    parts = {"pull": pull_s, **{k: phases.get(k, 0.0) for k in PARTS[1:5]}}
    parts["agent_other"] = total_s - sum(parts.values())
    return {"pod_start_to_ready_s": round(total_s, 3),
            "parts_s": {k: round(v, 3) for k, v in parts.items()},
            "pull": pulled, "agent_phases": phases,
            "vllm_timeline_s": agent["timeline"]}  # fmt: skip


def prepare(names: list[str], store: Path) -> list[dict]:
    """Each model's prepared folder, published into the store as <served>/v1."""
    models = []
    for name in names:
        folder, served = resolve(name)
        published = store / served / "v1"
        shutil.copytree(folder, published)
        size = sum(p.stat().st_size for p in published.rglob("*") if p.is_file())
        models.append({"name": name, "served": served, "store": store,
                       "checksum": folder_checksum(published), "bytes": size})  # fmt: skip
    return models


def measure(models: list[dict], rounds: int, run: Path, router_url: str) -> list[dict]:
    runs = []
    for model in models:
        warm_cache = run / f"cache-{model['name']}"
        pull(model["served"], model["store"], model["checksum"], warm_cache)  # pre-pull
        for index in range(rounds):
            for cached in (False, True):
                cache = warm_cache if cached else Path(tempfile.mkdtemp(dir=run))
                name = f"{model['name']}-{'cached' if cached else 'uncached'}-{index}"
                print(f"[cold start] {name}", flush=True)
                result = one_start(run, name, model, cache, router_url)
                print(f"[cold start] {name}: {result['pod_start_to_ready_s']:.1f}s "
                      f"{result['parts_s']}", flush=True)  # fmt: skip
                runs.append({"model": model["name"], "cached": cached, "round": index,
                             **result})  # fmt: skip
    return runs


def summary(runs: list[dict]) -> list[dict]:
    rows = []
    for model in dict.fromkeys(r["model"] for r in runs):
        for cached in (False, True):
            mine = [r for r in runs if r["model"] == model and r["cached"] == cached]
            rows.append({
                "model": model, "cached": cached, "starts": len(mine),
                "pod_start_to_ready_s_median": round(
                    statistics.median(r["pod_start_to_ready_s"] for r in mine), 2),
                "parts_s_median": {p: round(statistics.median(r["parts_s"][p] for r in mine), 2)
                                   for p in PARTS},
                "vllm_timeline_s_median": {
                    m: statistics.median(r["vllm_timeline_s"].get(m, -1) for r in mine)
                    for m in MILESTONES},
            })  # fmt: skip
    return rows


def plot(rows: list[dict], machine: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{'cached' if r['cached'] else 'uncached'}" for r in rows]
    figure, axes = plt.subplots(figsize=(8, 4.5))
    bottom = [0.0] * len(rows)
    for part in PARTS:
        values = [r["parts_s_median"][part] for r in rows]
        axes.bar(labels, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes.set_ylabel("seconds from pod start to ready (median)")
    axes.set_title(f"Cold start in parts\n{describe(machine)}", fontsize=8)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    run = Path(tempfile.mkdtemp(prefix="cold-start-"))
    models = prepare(args.models.split(","), run / "store")
    router, router_url = start_router(run)
    try:
        runs = measure(models, args.rounds, run, router_url)
    finally:
        process_group.stop([router], grace_s=15)
    machine = machine_record()
    rows = summary(runs)
    result = {
        "command": ("python -m benchmarks.cold_start " + " ".join(argv or sys.argv[1:])).strip(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine,
        "load_average": [round(load, 2) for load in os.getloadavg()],
        "models": [{k: v for k, v in m.items() if k != "store"} for m in models],
        "summary": rows,
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cold_start.json").write_text(json.dumps(result, indent=2))
    plot(rows, machine, out / "cold_start.png")
    print(json.dumps(rows, indent=2))
    shutil.rmtree(run, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
