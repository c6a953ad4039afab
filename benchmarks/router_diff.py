"""Differential run of the drop-in corpus: another tree's router against this one's.

One sim cluster of this tree (1 prefill + 1 decode + 1 colocated under its own name, the
shape of the tests' clusters) and, in front of the same engines, the router of ``--ref-tree``
(say, the checkout before a restructure) with the same router settings. Every request
of ``loadgen.drop_in_corpus`` goes, one at a time, to both routers, for the P/D model
and for the colocated name; the answers are compared: status, media type, and the JSON
body (or, for an SSE stream, the sequence of data events, choice by choice: the engine
interleaves several choices' chunks as they come) with volatile fields set aside.

Volatile fields: ``id``, ``created`` and ``system_fingerprint`` always, plus whatever the
self-check finds: the corpus is sent twice to each router and any field whose value
differs between the two passes on the same router is volatile too. Every field set aside
is named and counted in the result. Before those passes one pass warms the engines
(prefix caches) through the current router; what differed between it and the next pass
is recorded, not set aside.

    python -m benchmarks.router_diff --ref-tree PATH [--out benchmarks/results]

Writes ``<out>/router_diff.json``; exits 1 where a case differs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from agent import process_group
from benchmarks.reference_router import NEVER_STALE, start_reference_router
from contracts.machine import machine_record
from loadgen.drop_in_corpus import cases, request
from localrun.cluster import ClusterPlan, LocalCluster
from localrun.ports import free_ports
from modelstore import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
MODEL = tiny_llama.SERVED_NAME
COLOCATED_MODEL = f"{MODEL}-colocated"
MODELS = {"pd": MODEL, "colocated": COLOCATED_MODEL}
ALWAYS_VOLATILE = ("id", "created", "system_fingerprint")
VOLATILE = "<volatile>"
# The router settings both routers run with. PYTHONPROFILEIMPORTTIME only makes each
# router's Python log the modules it imports (to stderr, into its log): the evidence of
# which tree's code each one ran.
ROUTER_ENV = {"PDSERVE_HEALTH_INTERVAL_S": "0.5", "PYTHONPROFILEIMPORTTIME": "1"}
# A module each layout has and the other lacks (router/api.py became router/http/api.py).
OLD_LAYOUT_MODULE, NEW_LAYOUT_MODULE = "router.api", "router.http.api"

Answer = dict[str, Any]


def ask(base_url: str, path: str, body: dict) -> Answer:
    """One POST: status, media type, and the JSON body or the SSE data events (each
    parsed where it is JSON), or the raw text where the body is neither."""
    post = urllib.request.Request(
        base_url + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(post, timeout=120) as response:
            status, headers, raw = response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        status, headers, raw = error.code, error.headers, error.read().decode()
    media = (headers.get("content-type") or "").split(";")[0].strip()
    answer: Answer = {"status": status, "media_type": media}
    if media == "text/event-stream":
        events = []
        for line in raw.splitlines():
            if line.startswith("data:"):
                data = line.partition(":")[2].strip()
                events.append(_json_or_text(data))
        answer["events"] = events
    else:
        answer["body"] = _json_or_text(raw)
    return answer


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def send_corpus(url: str) -> dict[str, Answer]:
    return {case: ask(url, path, request(shape, model)) for case, path, shape, model in corpus()}


def corpus() -> list[tuple[str, str, dict, str]]:
    """(case name, path, shape, model) for every corpus shape, per model."""
    return [(f"{served}/{kind}: {name}", path, shape, model)
            for served, model in MODELS.items()
            for kind, path, name, shape in cases()]  # fmt: skip


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Every leaf by its path (``choices[0].text``); an empty dict or list is a leaf."""
    if isinstance(value, dict) and value:
        out = {}
        for key, item in value.items():
            out.update(leaves(item, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for index, item in enumerate(value):
            out.update(leaves(item, f"{path}[{index}]"))
        return out
    return {path: value}


def pattern(path: str) -> str:
    """A leaf's path with list indices left out: ``choices[0].text`` -> ``choices[].text``."""
    return re.sub(r"\[\d+\]", "[]", path)


def stream_of(event: Any) -> str:
    """Which stream of a response an SSE event belongs to: the choice indices it carries
    (vLLM sends one choice a chunk), ``usage`` for a chunk without choices, ``end`` for
    ``[DONE]``."""
    if not isinstance(event, dict):
        return "end" if event == "[DONE]" else "other"
    indices = [c.get("index") for c in event.get("choices") or [] if isinstance(c, dict)]
    return f"choice {','.join(map(str, indices))}" if indices else "usage"


def documents(answer: Answer, *, per_choice: bool = True) -> dict[str, Any]:
    """What is compared field by field, by label: the body, or each SSE data event. With
    ``per_choice``, events are taken choice by choice (in order within each): with n > 1
    or several prompts the engine interleaves the choices' chunks as they come, which
    the self-check shows differs between two identical calls to the same router."""
    if "events" not in answer:
        return {"body": answer["body"]}
    if not per_choice:
        return {f"events[{i}]": event for i, event in enumerate(answer["events"])}
    streams: dict[str, list[Any]] = {}
    for event in answer["events"]:
        streams.setdefault(stream_of(event), []).append(event)
    return {f"{stream}, event {i}": event
            for stream in sorted(streams) for i, event in enumerate(streams[stream])}  # fmt: skip


def differing_fields(a: Answer, b: Answer, *, per_choice: bool = True) -> set[str]:
    """The field patterns whose values differ between two answers (within each body or
    event); ``(status)``, ``(media_type)`` or ``(events)`` (not the same events, by
    label) where those do."""
    fields = {f"({key})" for key in ("status", "media_type") if a[key] != b[key]}
    left, right = documents(a, per_choice=per_choice), documents(b, per_choice=per_choice)
    if left.keys() != right.keys():
        fields.add("(events)")
    for label in left.keys() & right.keys():
        lx, ly = leaves(left[label]), leaves(right[label])
        for path in lx.keys() | ly.keys():
            if lx.get(path, "<absent>") != ly.get(path, "<absent>"):
                fields.add(pattern(path))
    return fields


def normalise(answer: Answer, volatile: set[str], counts: Counter) -> Answer:
    """``answer`` with every top-level-or-nested field whose pattern is volatile replaced
    by ``<volatile>``; ``counts`` counts the values replaced, by pattern."""

    def walk(value: Any, path: str) -> Any:
        if path and pattern(path) in volatile:
            counts[pattern(path)] += 1
            return VOLATILE
        if isinstance(value, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value

    out = {k: v for k, v in answer.items() if k not in ("body", "events")}
    if "events" in answer:
        out["events"] = [walk(event, "") for event in answer["events"]]
    else:
        out["body"] = walk(answer["body"], "")
    return out


def first_difference(a: Answer, b: Answer) -> dict | None:
    """The first place two (normalised) answers differ, in document order."""
    for key in ("status", "media_type"):
        if a[key] != b[key]:
            return {"where": key, "current": a[key], "reference": b[key]}
    left, right = documents(a), documents(b)
    for label in [*left, *(k for k in right if k not in left)]:
        if label not in left or label not in right:
            return {"where": label, "current": "<absent>" if label not in left else "present",
                    "reference": "<absent>" if label not in right else "present"}  # fmt: skip
        lx, ly = leaves(left[label]), leaves(right[label])
        for path in [*lx, *(p for p in ly if p not in lx)]:
            if lx.get(path, "<absent>") != ly.get(path, "<absent>"):
                return {"where": f"{label}: {path}", "current": lx.get(path, "<absent>"),
                        "reference": ly.get(path, "<absent>")}  # fmt: skip
    return None


def self_check(
    first: dict[str, Answer], second: dict[str, Answer], *, per_choice: bool = True
) -> dict[str, list[str]]:
    """Field patterns that differed between two passes, each with the cases it did in."""
    found: dict[str, list[str]] = {}
    for case in first:
        for field in sorted(differing_fields(first[case], second[case], per_choice=per_choice)):
            found.setdefault(field, []).append(case)
    return found


def imported_layout(log: Path) -> dict[str, bool]:
    """Whether a router's log (with PYTHONPROFILEIMPORTTIME) shows the old or the new
    layout's module imported."""
    names = {line.rsplit("|", 1)[-1].strip() for line in log.read_text().splitlines()
             if line.startswith("import time:")}  # fmt: skip
    return {OLD_LAYOUT_MODULE: OLD_LAYOUT_MODULE in names,
            NEW_LAYOUT_MODULE: NEW_LAYOUT_MODULE in names}  # fmt: skip


def resolved_in(tree: Path, pid: int) -> dict[str, str]:
    """Where ``router`` resolves for a Python started as the reference router was: its
    cwd and environment, read back from the running process."""
    cwd = Path(f"/proc/{pid}/cwd").resolve()
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    probe = subprocess.run(
        [sys.executable, "-c", "import router, cli.main; print(router.__file__); "
         "print(cli.main.__file__)"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    router_file, cli_file = probe.stdout.split()
    return {"process_cwd": str(cwd), "router": router_file, "cli.main": cli_file,
            "inside_ref_tree": str(Path(router_file).is_relative_to(tree.resolve())
                                   and Path(cli_file).is_relative_to(tree.resolve()))}  # fmt: skip


def git_head(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="router-diff-"))
    (port,) = free_ports(1)
    plan = ClusterPlan(
        model_path=tiny_llama.ensure(), served_name=MODEL,
        colocated_served_name=COLOCATED_MODEL, prefill=1, decode=1, colocated=1, port=port,
        run_dir=run_dir, engine="sim", ready_timeout_s=60, heartbeat_interval_s=0.5,
        drain_timeout_s=2, router_env=ROUTER_ENV,
    )  # fmt: skip
    cluster = LocalCluster(plan)
    reference: subprocess.Popen | None = None
    try:
        cluster.start()
        ref_url, reference = start_reference_router(
            args.ref_tree, cluster, run_dir, cluster.plan.router_env
        )
        resolution = resolved_in(args.ref_tree, reference.pid)
        passes = {}
        for name, url in (("warm-up (current)", cluster.router_url),
                          ("current 1", cluster.router_url), ("reference 1", ref_url),
                          ("current 2", cluster.router_url), ("reference 2", ref_url)):  # fmt: skip
            started = time.monotonic()
            passes[name] = send_corpus(url)
            print(f"pass {name}: {len(passes[name])} requests in "
                  f"{time.monotonic() - started:.1f} s", flush=True)  # fmt: skip
        layouts = {"current": imported_layout(run_dir / "router.log"),
                   "reference": imported_layout(run_dir / "router_ref.log")}  # fmt: skip
    finally:
        if reference is not None:
            process_group.stop([reference], grace_s=5)
        cluster.stop()
    return compare(args, passes, resolution, layouts)


def compare(args: argparse.Namespace, passes: dict, resolution: dict, layouts: dict) -> dict:
    current_volatile = self_check(passes["current 1"], passes["current 2"])
    reference_volatile = self_check(passes["reference 1"], passes["reference 2"])
    volatile = {*ALWAYS_VOLATILE, *current_volatile, *reference_volatile}
    counts = {"current": Counter(), "reference": Counter()}
    results = []
    for case, path, _, _ in corpus():
        current = normalise(passes["current 1"][case], volatile, counts["current"])
        ref = normalise(passes["reference 1"][case], volatile, counts["reference"])
        difference = first_difference(current, ref)
        in_order = documents(current, per_choice=False) == documents(ref, per_choice=False)
        results.append({"case": case, "endpoint": path, "status_current": current["status"],
                        "status_reference": ref["status"], "equal": difference is None,
                        "first_difference": difference,
                        "equal_in_arrival_order": in_order})  # fmt: skip
        print(f"{'equal    ' if difference is None else 'DIFFERENT'} {current['status']} "
              f"{ref['status']}  {case}" + (f"  {difference}" if difference else ""))  # fmt: skip
    equal = sum(r["equal"] for r in results)
    totals = {"cases": len(results), "equal": equal, "different": len(results) - equal}
    print(f"totals: {totals}")
    return {
        "command": "python -m benchmarks.router_diff " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine_record(),
        "current_commit": git_head(ROOT),
        # Uncommitted changes to the current tree's router (empty: it ran its commit's).
        "current_router_uncommitted": subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "router", "contracts"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines(),
        "reference_tree": str(args.ref_tree),
        "reference_commit": git_head(args.ref_tree),
        "router_env": ROUTER_ENV,
        "reference_router_env_extra": NEVER_STALE,
        "models": MODELS,
        "totals": totals,
        "self_check": {
            "method": "the corpus sent twice to each router (after one warm-up pass through "
            "the current router); a field is volatile where its two values differ (stream "
            "events compared choice by choice, as the cases are)",
            "volatile_on_current": current_volatile,
            "volatile_on_reference": reference_volatile,
            # Not set aside: what the same comparisons find with events in arrival order.
            "in_arrival_order": {
                "volatile_on_current": self_check(
                    passes["current 1"], passes["current 2"], per_choice=False
                ),
                "volatile_on_reference": self_check(
                    passes["reference 1"], passes["reference 2"], per_choice=False
                ),
            },
            "warm_up_vs_current_1": self_check(passes["warm-up (current)"], passes["current 1"]),
        },
        "normalised": {
            "always": list(ALWAYS_VOLATILE),
            "fields": sorted(volatile),
            "values_replaced": {side: dict(sorted(c.items())) for side, c in counts.items()},
        },
        "reference_ran_its_own_code": {"module_resolution": resolution, "imported": layouts},
        "cases": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ref-tree", type=Path, required=True, help="the other checkout")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    summary = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "router_diff.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"reference ran its own code: {summary['reference_ran_its_own_code']}")
    if summary["totals"]["different"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
